"""benchmarks/profile_round.py: HLO parsing, the tables, and a tiny traced run."""

from absl import flags
import jax
import pytest

from benchmarks import profile_round

# A hand-written excerpt in the form `compiled.as_text()` prints.
CONV_SOURCE = (
  'jit(jitted)/vmap()/while/body/closed_call/'
  'transpose(jvp(SmallCNN))/Conv_1/conv_general_dilated'
)
HLO = '\n'.join(
  [
    'HloModule jit_jitted, is_scheduled=true, entry_computation_layout={()}',
    '',
    '%fused_computation.7 (param_0: f32[2,3]) -> f32[2,3] {',
    '  %param_0 = f32[2,3]{1,0} parameter(0)',
    '  ROOT %neg.1 = f32[2,3]{1,0} negate(%param_0)',
    '}',
    '',
    'ENTRY %main (p: f32[8,3,3,32,64]) -> f32[] {',
    '  %conv_general_dilated.39 = f32[3,3,32,512]{3,2,1,0} '
    'convolution(%a, %b), window={size=7x7}, dim_labels=f01b_i01o->01bf, '
    f'feature_group_count=8, metadata={{op_name="{CONV_SOURCE}" '
    'stack_frame_id=1}',
    '  %ynn_fusion.7 = f32[16,7,7,512]{3,2,1,0} fusion(%c, %d), '
    'kind=kCustom, calls=%fused_computation.7, metadata={op_name='
    '"jit(jitted)/vmap()/while/body/jvp(SmallCNN)/Conv_1/'
    'conv_general_dilated"}',
    '  %while.4 = (s32[], f32[8,32]{1,0}, /*index=2*/f32[8]{0}) '
    'while(%t), condition=%cond, body=%body',
    '  %custom-call.3 = (f32[64,64]{1,0}, s8[0]{0}) custom-call(%e, %f), '
    'custom_call_target="__cublas$gemm"',
    '  ROOT %copy.48 = f32[8,64]{1,0} copy(%g)',
    '}',
  ]
)


def test_parse_hlo_reads_opcode_detail_and_source():
  ops = profile_round.parse_hlo(HLO)
  conv = ops['conv_general_dilated.39']
  assert conv.opcode == 'convolution'
  assert conv.detail == 'feature_group_count=8'
  assert (
    conv.source
    == 'backward transpose(jvp(SmallCNN))/Conv_1/conv_general_dilated'
  )
  fusion = ops['ynn_fusion.7']
  assert (fusion.opcode, fusion.detail) == ('fusion', 'kCustom')
  assert fusion.source == 'jvp(SmallCNN)/Conv_1/conv_general_dilated'
  assert ops['while.4'].opcode == 'while'  # a tuple type is skipped whole
  assert ops['custom-call.3'].detail == '__cublas$gemm'
  assert ops['copy.48'] == profile_round.HloOp('copy', '', '')
  assert ops['neg.1'].opcode == 'negate'  # inside a fused computation
  assert 'HloModule' not in ops and 'ENTRY' not in ' '.join(ops)
  assert profile_round.category(conv) == 'convolution'
  assert profile_round.category(ops['custom-call.3']) == 'matmul'
  assert profile_round.category(fusion) == 'fusion (library)'
  assert profile_round.category(ops['copy.48']) == 'copy / transpose'


def test_summarize_by_hand():
  ops = profile_round.parse_hlo(HLO)
  # Two rounds: the convolution 2 x 3 ms per round, the fusion 2 ms, the
  # copy 1 ms: 9 ms per round in all.
  times = {
    'conv_general_dilated.39': [3e6, 3e6, 3e6, 3e6],
    'ynn_fusion.7': [2e6, 2e6],
    'copy.48': [1e6, 1e6],
  }
  categories, top, total = profile_round.summarize(times, ops, rounds=2, top=2)
  assert total == 9.0
  assert categories == [
    ['convolution', 'backward', '6.00', '66.7%'],
    ['fusion (library)', 'forward', '2.00', '22.2%'],
    ['copy / transpose', 'forward', '1.00', '11.1%'],
  ]
  assert top[0] == [
    'convolution feature_group_count=8',
    'backward transpose(jvp(SmallCNN))/Conv_1/conv_general_dilated',
    '`conv_general_dilated.39`',
    '2',
    '6.00',
    '66.7%',
  ]
  assert top[1][:3] == [
    'fusion kCustom',
    'jvp(SmallCNN)/Conv_1/conv_general_dilated',
    '`ynn_fusion.7`',
  ]
  assert len(top) == 2
  # Copies of one op (an unrolled loop's) are one row.
  twin = {**ops, 'copy.49': ops['copy.48']}
  _, top, _ = profile_round.summarize(
    {'copy.48': [1e6], 'copy.49': [3e6]}, twin, rounds=1, top=5
  )
  assert top == [['copy', '-', '`copy.48` (+1)', '2', '4.00', '100.0%']]


def test_tiny_traced_round_finds_its_convolutions(tmp_path):
  assert 'top' not in flags.FLAGS  # flags only when it is the program
  traced = profile_round.profile(
    num_clients=2,
    local_steps=1,
    batch_size=4,
    rounds=1,
    trace_dir=str(tmp_path),
    conv_impl='xla',  # the grouped convolutions this test looks for
  )
  settings = traced.settings
  assert traced.path.startswith(str(tmp_path)) and len(settings['seconds']) == 1
  assert settings['conv_impl'] == 'xla'
  assert settings['unroll'] == (jax.default_backend() == 'cpu')
  hlo, times = traced.hlo, traced.times
  library = [n for n in times if n.startswith(profile_round.LIBRARY)]
  assert times and all(name in hlo for name in times if name not in library)
  # Only a GPU's cuBLAS / cuDNN kernels go unnamed by the program.
  assert not library or jax.default_backend() == 'gpu'
  categories, _, total = profile_round.summarize(times, hlo, rounds=1, top=5)
  assert total > 0
  passes = {(kind, direction) for kind, direction, _, _ in categories}
  if jax.default_backend() == 'cpu':
    # The small CNN's convolutions run forward and backward in the round.
    assert ('convolution', 'backward') in passes
  else:  # cuDNN's kernels carry no source, so no direction either
    assert 'convolution' in {kind for kind, _ in passes}
  # The trace re-read from its folder (--from_trace) gives the same times.
  again = profile_round.saved_profile(str(tmp_path))
  assert again.times == times and again.settings == settings
  with pytest.raises(FileNotFoundError, match='--from_trace'):
    profile_round.saved_profile(str(tmp_path / 'plugins'))


def test_gpu_kernels_are_matched_to_the_program_by_name():
  """A GPU kernel is named after its fusion with '.' as '_'; a cuBLAS
  kernel inside a CUDA graph matches nothing and is kept as a library op."""
  ops = profile_round.parse_hlo(HLO)
  names = {n.replace('.', '_').replace('-', '_'): n for n in ops}

  def key(event, stat=None, kernel=True):
    return profile_round.event_key(event, stat, ops, names, kernel=kernel)

  assert key('ynn_fusion_7') == 'ynn_fusion.7'  # the kernel of a fusion
  assert key('x', stat='custom-call.3') == 'custom-call.3'  # by its stat
  assert key('ynn_fusion_7', stat='command_buffer_1') == 'ynn_fusion.7'
  assert (
    key('sm90_xmma_gemm_f32') == profile_round.LIBRARY + 'sm90_xmma_gemm_f32'
  )
  assert key('while.4', kernel=False) is None  # a container times children
  assert key('copy.48', kernel=False) == 'copy.48'  # a CPU thread's event
  assert key('unknown', kernel=False) is None
  assert profile_round.op_of('conv_general_dilated.39', ops).opcode == (
    'convolution'
  )
  gemm = profile_round.op_of(
    profile_round.LIBRARY + 'sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n', ops
  )
  assert gemm == profile_round.HloOp('library', 'cuBLAS gemm', '')
  assert profile_round.category(gemm) == 'matmul'
  fprop = profile_round.library_op('sm90_xmma_fprop_implicit_gemm_tf32')
  assert profile_round.category(fprop) == 'convolution'
  assert profile_round.library_op('nvjet_sm90_tst_96x128_64x7')[1] == (
    'cuBLAS gemm'
  )
  assert profile_round.library_op('Memset 0')[1] == 'memcpy / memset'
  # A Triton GEMM fusion says so in its backend config: a matmul.
  triton = profile_round.parse_hlo(
    '  %gemm_fusion_dot.11 = f32[100,576,128]{2,1,0} fusion(%a, %b), '
    'kind=kCustom, calls=%gemm_fusion_dot.11_computation, '
    'backend_config={"fusion_backend_config":{"kind":'
    '"__triton_nested_gemm_fusion"}}'
  )['gemm_fusion_dot.11']
  assert triton.detail == 'kCustom __triton_nested_gemm_fusion'
  assert profile_round.category(triton) == 'matmul'
  # A Pallas kernel is a custom call to XLA's Triton runner.
  pallas = profile_round.parse_hlo(
    '  %custom-call.5 = bf16[1024,64]{1,0} custom-call(%p, %w), '
    'custom_call_target="__gpu$xla.gpu.triton", '
    'metadata={op_name="jit(step)/implicit_conv"}'
  )['custom-call.5']
  assert profile_round.category(pallas) == 'pallas kernel'
