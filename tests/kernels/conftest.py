"""Set up Triton (interpreter without a GPU) before any kernel test module imports a kernel."""

import kernel_device  # noqa: F401  (sets TRITON_INTERPRET when there is no GPU)
