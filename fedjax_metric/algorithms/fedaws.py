"""FedAwS building blocks: the server-side spreadout regulariser.

Yu, Rawat, Menon and Kumar, 'Federated Learning with Only Positive Labels',
ICML 2020. Each client holds one class, trains the shared network and its
own class embedding w_y with the positive-only loss
`fedjax_metric.losses.fedaws_positive_loss`, and the server, after averaging,
takes a gradient step on `spreadout_regularizer` over the full class
embedding matrix so the classes do not collapse onto one point.

The regulariser is defined once, in `fedjax_metric.losses.oneclass`, and
re-exported here.
"""

from fedjax_metric.losses.oneclass import spreadout_regularizer  # noqa: F401
