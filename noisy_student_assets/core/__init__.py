"""The Dagster-free core: what a worker process on another machine imports.

vLLM's own import warns that `torch.distributed.reduce_op` is deprecated (its code, not this project's): silenced
here, where every module that imports vLLM (sampling, training's rollouts) starts.
"""

import warnings

warnings.filterwarnings("ignore", message=r"`torch.distributed.reduce_op` is deprecated", category=FutureWarning)
