# The README's two commands: `make demo` and `make test`. Both bootstrap a fresh machine first.
SHELL := /bin/bash
PYTHON ?= python3
CORE_BUILD ?= build/core
# Per fuzzer, in CI: the corpus in tests/fuzz carries what earlier runs found.
FUZZ_SECONDS ?= 30
CUDA_ARCHS ?= 80 90
CUDA_HOME ?= /usr/local/cuda
# The GoogleTest suite under ASan + UBSan and the fuzzers share one clang build.
SANITIZE_BUILD = cmake -S . -B build/sanitize -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DTP_FUZZ=ON >/dev/null && \
	  cmake --build build/sanitize -j2
# make test-py's first phase: the tests that start no rank process, this many at a time (one
# Dynamo trace keeps one core busy). Multi-rank tests then run one at a time.
PYTEST_WORKERS ?= 2
CORE_DIRS = csrc/ir csrc/pattern csrc/cost csrc/solver csrc/passes csrc/sim

.PHONY: bootstrap demo test test-cpp test-sanitize fuzz test-py test-wheel cuda-check check-core-deps lint stubtest benchmarks clean

bootstrap:
	@echo "[$$(date +%T)] make bootstrap"
	@bash scripts/bootstrap.sh

demo: bootstrap
	$(PYTHON) examples/quickstart.py

# The GoogleTest suite runs once, under the sanitizers (test-sanitize): a second, optimised g++
# build of it (test-cpp, the quick local loop) took a minute of CI for the same 187 tests, and
# the optimised core is what _C, and so pytest, runs.
test: bootstrap check-core-deps lint test-sanitize fuzz cuda-check test-wheel test-py
	@echo "[$$(date +%T)] make test: all passed"

# The torch-free core and its GoogleTest suite.
test-cpp:
	@echo "[$$(date +%T)] make test-cpp"
	cmake -S . -B $(CORE_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(CORE_BUILD) -j2
	ctest --test-dir $(CORE_BUILD) --output-on-failure -j2

# The same GoogleTest suite under AddressSanitizer (+LeakSanitizer) and UBSan (clang).
test-sanitize:
	@echo "[$$(date +%T)] make test-sanitize"
	$(SANITIZE_BUILD)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build/sanitize --output-on-failure -j2

# A bounded libFuzzer run over the graph builder / verifier / pipeline (clang, ASan, UBSan).
# Per fuzzer: new inputs go to build/sanitize/corpus-<name>, crashes to build/sanitize/crash-*, seeds and
# regressions live in tests/fuzz/corpus-<name>.
fuzz:
	@echo "[$$(date +%T)] make fuzz"
	$(SANITIZE_BUILD)
	@# One fuzzer per core, side by side; each one's summary is printed after both finish.
	pids=(); names=(); \
	for f in build/sanitize/*_fuzzer; do \
	  name=$$(basename $$f _fuzzer); mkdir -p build/sanitize/corpus-$$name tests/fuzz/corpus-$$name; \
	  ASAN_OPTIONS=detect_leaks=1 $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=build/sanitize/ build/sanitize/corpus-$$name tests/fuzz/corpus-$$name \
	    > build/sanitize/fuzz-$$name.log 2>&1 & \
	  pids+=($$!); names+=($$name); \
	done; \
	rc=0; for i in "$${!pids[@]}"; do \
	  wait $${pids[$$i]}; st=$$?; echo "fuzzer $${names[$$i]}: exit $$st"; \
	  grep -E "^(stat::|#[0-9]+ +DONE|==|SUMMARY|artifact)" build/sanitize/fuzz-$${names[$$i]}.log; \
	  test $$st -eq 0 || { tail -n 60 build/sanitize/fuzz-$${names[$$i]}.log; rc=1; }; \
	done; exit $$rc

# CUDA kernels compile to objects for every target arch (one arch per core, side by side), and
# their torch-facing registration is syntax-checked against torch's CUDA headers, so neither can
# rot without a GPU.
# (The CPU wheel lacks one generated config header; a one-line stub stands in for it.)
cuda-check:
	@echo "[$$(date +%T)] make cuda-check"
	@if command -v nvcc >/dev/null 2>&1; then \
	  mkdir -p build/cuda-check; \
	  pids=(); for a in $(CUDA_ARCHS); do \
	    ( for f in kernels/cuda/*.cu; do \
	        echo "nvcc sm_$$a $$f"; \
	        nvcc -std=c++20 -O2 -Werror all-warnings -Ikernels \
	          -gencode arch=compute_$$a,code=sm_$$a -c $$f \
	          -o build/cuda-check/$$(basename $$f .cu).sm_$$a.o || exit 1; \
	      done ) & pids+=($$!); \
	  done; \
	  for p in "$${pids[@]}"; do wait $$p || exit 1; done; \
	  stub=build/cuda-check/stub/c10/cuda/impl; mkdir -p $$stub; \
	  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > $$stub/cuda_cmake_macros.h; \
	  inc=$$($(PYTHON) -c "from torch.utils.cpp_extension import include_paths as p; \
	    print(' '.join('-I' + d for d in p()))"); \
	  for f in kernels/cuda/*.cpp; do \
	    echo "g++ -fsyntax-only $$f (CUDA registration, torch CUDA headers)"; \
	    g++ -std=c++20 -fsyntax-only -Ibuild/cuda-check/stub $$inc -I$(CUDA_HOME)/include \
	      -Ikernels $$f || exit 1; \
	  done; \
	else echo "cuda-check: nvcc not found, skipped"; fi

# The wheel, installed in a fresh venv, used from outside the source tree.
test-wheel:
	@echo "[$$(date +%T)] make test-wheel"
	bash scripts/wheel_smoke.sh

test-py:
	@echo "[$$(date +%T)] make test-py"
	@rc=0; \
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) -m "not multirank" --durations=25 \
	  --junitxml=build/pytest.xml tests/python || rc=$$?; \
	echo "[$$(date +%T)] make test-py: multi-rank tests, one at a time"; \
	$(PYTHON) -m pytest -q -m multirank --durations=25 \
	  --junitxml=build/pytest-multirank.xml tests/python || rc=$$?; \
	exit $$rc

# The core must build without LibTorch or Python: only csrc/bindings and kernels/ include them.
check-core-deps:
	@if grep -rnE '#include *[<"](torch/|ATen/|c10/|pybind11/|Python\.h)' $(CORE_DIRS); then \
	  echo "check-core-deps: the C++ core must not include torch, pybind11 or Python" >&2; exit 1; \
	else echo "check-core-deps: core is torch- and Python-free"; fi

lint: stubtest
	$(PYTHON) -m ruff check torch_plugin tests/python benchmarks examples scripts

# torch_plugin/_C.pyi against the built module (regenerate it with scripts/gen_stub.sh).
stubtest:
	@echo "[$$(date +%T)] make stubtest"
	$(PYTHON) -m mypy.stubtest torch_plugin._C --mypy-config-file scripts/stubtest.ini \
	  --allowlist scripts/stubtest_allowlist.txt

benchmarks: bootstrap
	$(PYTHON) benchmarks/compile_overhead.py

clean:
	rm -rf build torch_plugin/_C*.so
