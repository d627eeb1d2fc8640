# A package, so that its conftest.py imports as `gpu.conftest`: a second plain `conftest`
# module would replace tests/conftest.py in sys.modules, and the suite's
# `from conftest import run_cli` would then find the wrong one.
