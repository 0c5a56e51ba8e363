"""What the Python suites share, imported as the package `support` (each suite's pytest.ini
puts tests/ on the import path with `pythonpath = ..`; scripts such as benches/interp_bench.py
add tests/ to sys.path themselves).

- `support.warren`: the harness, plain code: the API key, the one skip rule (`require`), the
  runtime tiering (`same_on_every_runtime`), `Server` (one `warren serve`) and the session's
  shared server (`session_server`).
- `support.fixtures`: the pytest fixtures several suites share (`server`, `api`, `registry`,
  ...), each a few lines over `support.warren`; a suite's conftest imports the ones it uses.
- `support.registry`: a real OCI registry on loopback and images made here.
"""
