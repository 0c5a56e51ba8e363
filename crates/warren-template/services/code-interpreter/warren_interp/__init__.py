"""Warren's code-interpreter server: the E2B code-interpreter HTTP protocol on port 49999.

Modules:
  server.py       HTTP front end (standard library only), one thread per request
  contexts.py     contexts = Jupyter kernels, driven with jupyter_client; execution loop
  output.py       Jupyter messages -> the wire's JSON lines
  charts.py       matplotlib figure -> the SDK's `chart` object (runs inside the kernel)
  kernel_setup.py run by every Python kernel at start: registers chart/data formatters
  bash_kernel.py  a small bash kernel on ipykernel's base class
  supervise.py    restarts the server when it dies; the host starts this one

The host writes this package into the code-interpreter-v1 image (it is part of the recipe, so
any change rebuilds the image) and starts supervise.py after the agent is initialised.
"""
