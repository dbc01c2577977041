# mpengine build. `make` builds the engine library, the Lua module and the CLI;
# `make test` and `make demo` first install missing Debian packages (make deps).

.DEFAULT_GOAL := all
PREFIX   ?= /usr/local
BUILD    ?= build
# make test SAN=1: everything built with AddressSanitizer, UndefinedBehaviorSanitizer
# (any report fails) and LeakSanitizer, in its own build directory, and the whole
# suite run on it (tests/run.sh preloads the runtime into lua5.4). UBSan with
# float-cast-overflow, which -fsanitize=undefined leaves out: a double cast to an
# integer it does not fit (conv's groups = 1e300 was one) is undefined too.
ifeq ($(SAN),1)
BUILD    := $(BUILD)-san
SANFLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow \
            -fno-omit-frame-pointer
endif
CC       ?= cc
LUA_INC  := $(shell pkg-config --cflags lua5.4 2>/dev/null || echo -I/usr/include/lua5.4)
LUA_LIB  := $(shell pkg-config --libs lua5.4 2>/dev/null || echo -llua5.4)
BLAS_INC := -I/usr/include/x86_64-linux-gnu/openblas-pthread
CFLAGS   ?= -O2 -g
# -fno-math-errno: nothing reads errno after sqrtf, and it lets loops with sqrtf vectorise
CFLAGS   += -std=gnu11 -Wall -Wextra -Werror=switch -Wno-unused-parameter -fPIC -fopenmp -fno-math-errno -I. $(BLAS_INC)
CFLAGS   += $(SANFLAGS)
LDLIBS   := $(SANFLAGS) -lopenblas -ldnnl -lsleef -lz -lcjson -lm -fopenmp -lpthread
VERSION  := 0.1.0

DEBS := liblua5.4-dev lua5.4 libopenblas-dev zlib1g-dev libreadline-dev libcriterion-dev \
        lua-busted dataset-fashion-mnist fortunes pkg-config gcc make libcjson-dev python3-venv \
        libsleef-dev libdnnl-dev gnuplot-nox openmpi-bin libopenmpi-dev

ENGINE_SRC := $(wildcard engine/*.c) $(wildcard kernels/cpu/*.c)
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/obj/%.o)
# the binding: lua/*.c but the host program (mpengine.c and its REPL)
CLI_SRC    := lua/mpengine.c lua/repl.c
CLI_OBJ    := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
BIND_SRC   := $(filter-out $(CLI_SRC),$(wildcard lua/*.c))
BIND_OBJ   := $(BIND_SRC:%.c=$(BUILD)/obj/%.o)
CTEST_SRC  := $(wildcard tests/c/test_*.c)
CTEST_BIN  := $(CTEST_SRC:tests/c/%.c=$(BUILD)/tests/%)
PARITY     := $(BUILD)/tests/parity
# a test double of the CUDA backend on the CPU (tests/device/fake_cuda.c), and
# a backend that does not load for want of a library (tests/device/missing_dep.c)
FAKE_CUDA  := $(BUILD)/tests/fake_cuda.so $(BUILD)/tests/missing_dep.so
BENCH_SRC  := $(wildcard scripts/bench/*.c)
BENCH_BIN  := $(BENCH_SRC:scripts/bench/%.c=$(BUILD)/bench/%)

# The CUDA backend: built whenever nvcc is found, as a shared object the engine
# loads at run time (sm_90 machine code, PTX for sm_80 and newer)
NVCC     ?= $(shell command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
CUDA_SRC := $(wildcard kernels/cuda/*.cu)
CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/obj/%.o)
# -fmad=false: a * b + c rounds twice, as the CPU kernels (-ffp-contract=off) do;
# nvcc would otherwise fuse it into one FMA (80 places in cuda_nn.cu alone, the
# softmax, cross-entropy and layer norm rows), and the two backends would differ
# in the last bit, which an f16/bf16 rounding can turn into a whole ulp. The
# math library's own FMAs (expf, erff, ...) are explicit and stay.
# -Werror=switch: a switch over a dtype or an optimizer kind has no default in
# the kernels, so a new one is an error at every switch that must learn it
NVFLAGS  := -std=c++17 -O3 -I. -Xcompiler -fPIC -Xcompiler -Werror=switch -fmad=false -gencode arch=compute_90,code=sm_90 \
            -gencode arch=compute_80,code=compute_80
CUDA_SO  := $(if $(SAN),,$(if $(NVCC),$(if $(CUDA_SRC),$(BUILD)/mp/cuda.so)))

# The emulated CUDA device (tests/emu): the .cu files of kernels/cuda compiled a
# second time, by the host C++ compiler against the emulator's device language
# (tests/emu/emu_device.h, force-included), linked with the emulated runtime,
# cuBLAS, cuDNN and NCCL into one backend that loads as MP_CUDA_BACKEND. Built
# wherever the CUDA toolkit's headers are (the runtime's types, __half and
# __nv_bfloat16 come from them; no GPU, driver or CUDA library is used); without
# them make test reports its cases skipped.
CXX      ?= g++
CUDA_INC ?= $(patsubst %/cuda_runtime.h,%,$(firstword $(wildcard /usr/local/cuda/include/cuda_runtime.h)))
# the FP8 test and exhaustive walk compare with the toolkit's host conversions
# (cuda_fp8.h is plain C) when its headers are here
FP8_REF  := $(if $(wildcard $(CUDA_INC)/cuda_fp8.h),-I$(CUDA_INC) -DMP_CUDA_FP8_REF)
$(BUILD)/tests/test_fp8 $(BUILD)/bench/fp8_exhaustive: CFLAGS += $(FP8_REF)
EMU_SO   := $(if $(CUDA_INC),$(if $(wildcard $(CUDA_INC)/cudnn.h),$(if $(wildcard $(CUDA_INC)/nccl.h),$(BUILD)/tests/emu_cuda.so)))
EMU_CU   := $(CUDA_SRC:%.cu=$(BUILD)/obj/emu/%.o)
EMU_OBJ  := $(patsubst %.cc,$(BUILD)/obj/emu/%.o,$(wildcard tests/emu/*.cc))
# -ffp-contract=off: every multiply and add rounds on its own, as nvcc's -fmad=false
EMUFLAGS := -std=c++17 -O2 -g -fPIC -ffp-contract=off -I. -I$(CUDA_INC) -DMP_EMU -Wall -Wextra -Werror=switch -Wno-unused-parameter \
            -Wno-unknown-pragmas -Wno-deprecated-declarations $(SANFLAGS)

$(BUILD)/obj/emu/kernels/cuda/%.o: kernels/cuda/%.cu $(wildcard kernels/cuda/*.h kernels/*.h tests/emu/*.h) Makefile
	@mkdir -p $(dir $@)
	$(CXX) $(EMUFLAGS) -x c++ -include tests/emu/emu_device.h -c $< -o $@

$(BUILD)/obj/emu/tests/emu/%.o: tests/emu/%.cc $(wildcard tests/emu/*.h kernels/*.h) Makefile
	@mkdir -p $(dir $@)
	$(CXX) $(EMUFLAGS) -c $< -o $@

# the emulator's own tests (Criterion), on kernels written to break it
EMU_TEST := $(if $(EMU_SO),$(BUILD)/tests/test_emu)
$(BUILD)/tests/test_emu: tests/emu/test_emu.cu $(EMU_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(EMUFLAGS) -x c++ -include tests/emu/emu_device.h -o $@ $< -x none $(EMU_OBJ) $(WHOLE_LIB) -lcriterion \
	  $(LDLIBS) -lrt

# -Bsymbolic: its runtime, libraries and copy of the CPU kernels are its own
$(EMU_SO): $(EMU_CU) $(EMU_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) -shared -Wl,-Bsymbolic -o $@ $(EMU_CU) $(EMU_OBJ) $(WHOLE_LIB) $(LDLIBS) -lrt

# mp.dist's link to MPI (kernels/mpi/mpi_comm.c): a shared object built with
# mpicc (Open MPI), loaded by the engine only under mpirun (engine/dist.c)
MPICC  ?= $(shell command -v mpicc 2>/dev/null)
MPI_SO := $(if $(MPICC),$(BUILD)/mp/mpi.so)

LIB  := $(BUILD)/libmpengine.a
# ops register themselves when loaded (engine/op.h): a program linked against
# the archive takes every object of it, not only those it calls
WHOLE_LIB = -Wl,--whole-archive $(LIB) -Wl,--no-whole-archive
CORE := $(BUILD)/mp/core.so
CLI  := $(BUILD)/mpengine

.PHONY: all deps pydeps test demo fuzz fuzz-bins bench bench-deps bench-gpu install clean gpu-bundle gpu-check
all: $(LIB) $(CORE) $(CLI) $(CUDA_SO) $(MPI_SO)
	@echo "built backends: cpu$(if $(CUDA_SO), and cuda ($(CUDA_SO), loaded when a GPU is present), (nvcc not found: no CUDA backend))$(if $(MPI_SO),; MPI for mp.dist ($(MPI_SO), loaded under mpirun),; no mpicc: mp.dist is a world of one)"

# kernels are built at -O3: their loops are what -O3's vectoriser is for; without
# contracting a*b+c into an FMA, so that the AVX-512, AVX2 and baseline clones of a
# loop (and the CUDA kernels, which round each operation) give the same bits
$(BUILD)/obj/kernels/%.o: CFLAGS += -O3 -ffp-contract=off
# the vector maths paths (kernels/cpu/vmath.h): each file for its instruction
# set, called only on a processor that has it
ifeq ($(shell uname -m),x86_64)
$(BUILD)/obj/kernels/cpu/vmath_avx512.o: CFLAGS += -mavx512f -mavx2 -mfma
$(BUILD)/obj/kernels/cpu/vmath_avx2.o: CFLAGS += -mavx2 -mfma
endif

$(BUILD)/obj/%.o: %.c $(wildcard engine/*.h kernels/*.h kernels/cpu/*.h lua/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LUA_INC) -DMP_VERSION='"$(VERSION)"' -c $< -o $@

$(BUILD)/obj/kernels/cuda/%.o: kernels/cuda/%.cu $(wildcard kernels/cuda/*.h kernels/*.h) Makefile
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(CUDA_SO): $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	$(NVCC) -shared -o $@ $^ -lcublasLt -lcublas -lcudnn -Xlinker -rpath,/usr/local/cuda/lib64

$(MPI_SO): kernels/mpi/mpi_comm.c kernels/comm.h kernels/backend.h
	@mkdir -p $(dir $@)
	$(MPICC) -std=gnu11 -O2 -g -Wall -Wextra -Wno-unused-parameter -fPIC -shared -I. -o $@ $<

$(LIB): $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# -z nodelete: lua_close unloads C modules, but OpenMP's worker threads may still
# be running code from this one
$(CORE): $(BIND_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-z,nodelete -o $@ $(BIND_OBJ) $(WHOLE_LIB) $(LDLIBS)

$(CLI): $(CLI_OBJ) $(BIND_OBJ) $(LIB)
	$(CC) -o $@ $(CLI_OBJ) $(BIND_OBJ) $(WHOLE_LIB) $(LUA_LIB) -lreadline $(LDLIBS) -Wl,-E

$(BUILD)/tests/%: tests/c/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(WHOLE_LIB) -lcriterion $(LDLIBS)

$(PARITY): tests/parity/parity.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(WHOLE_LIB) $(LDLIBS)

# -Bsymbolic: its copy of the CPU kernels and their state are its own, even
# inside build/mpengine, which exports the engine's symbols
$(BUILD)/tests/fake_cuda.so: tests/device/fake_cuda.c $(LIB) kernels/block_cache.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared -Wl,-Bsymbolic -o $@ $< $(WHOLE_LIB) $(LDLIBS)

# linked against a library that is then removed
$(BUILD)/tests/missing_dep.so: tests/device/missing_dep.c
	@mkdir -p $(BUILD)/tests/gone
	echo 'int mp_gone(void) { return 1; }' | $(CC) -shared -fPIC -x c - -o $(BUILD)/tests/gone/libmp_gone.so
	$(CC) -shared -fPIC -o $@ $< -L$(BUILD)/tests/gone -lmp_gone
	rm -rf $(BUILD)/tests/gone

$(BUILD)/bench/%: scripts/bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O3 -o $@ $< $(WHOLE_LIB) $(LDLIBS)

# make fuzz: libFuzzer targets built with clang, ASan and UBSan in build-fuzz/
# (tests/fuzz): the safetensors loader, mp.load through the binding, the IDX
# reader, a Lua program fuzzer of the API, and mp.data.text on any file (with
# encode, decode and windows); each runs FUZZ_S seconds from the
# committed corpus in tests/fuzz/corpus; crashes are saved in build-fuzz/crashes
# and fail the run
FUZZ_S       ?= 60
FUZZ_BUILD   := build-fuzz
FUZZ_TARGETS := safetensors load idx api text
# mp.amp.load_trace on plain and gzip'd traces, then replay of what it accepts
FUZZ_TARGETS += trace
FUZZ_BIN     := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
FUZZ_LUA     := -DMP_ROOT='"$(CURDIR)"' $(LUA_INC)

fuzz: deps
	@command -v clang >/dev/null 2>&1 || $(MAKE) --no-print-directory deps DEBS=clang
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang \
	  SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -fsanitize=fuzzer-no-link" fuzz-bins
	@FUZZ_S=$(FUZZ_S) BUILD=$(FUZZ_BUILD) sh tests/fuzz/run.sh $(FUZZ_TARGETS)

fuzz-bins: $(FUZZ_BIN)

$(BUILD)/fuzz/fuzz_safetensors $(BUILD)/fuzz/fuzz_idx: $(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_input.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $< $(WHOLE_LIB) $(LDLIBS)

$(BUILD)/fuzz/fuzz_load: tests/fuzz/fuzz_lua.c tests/fuzz/fuzz_input.h $(BIND_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(FUZZ_LUA) -fsanitize=fuzzer -o $@ $< $(BIND_OBJ) $(WHOLE_LIB) $(LUA_LIB) $(LDLIBS)

$(BUILD)/fuzz/fuzz_trace: tests/fuzz/fuzz_lua.c tests/fuzz/fuzz_input.h $(BIND_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(FUZZ_LUA) -DFUZZ_TRACE -fsanitize=fuzzer -o $@ $< $(BIND_OBJ) $(WHOLE_LIB) $(LUA_LIB) $(LDLIBS)

$(BUILD)/fuzz/fuzz_api: tests/fuzz/fuzz_lua.c tests/fuzz/fuzz_input.h tests/fuzz/api_driver.lua $(BIND_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(FUZZ_LUA) -DFUZZ_API -fsanitize=fuzzer -o $@ $< $(BIND_OBJ) $(WHOLE_LIB) $(LUA_LIB) $(LDLIBS)

$(BUILD)/fuzz/fuzz_text: tests/fuzz/fuzz_lua.c tests/fuzz/fuzz_input.h tests/fuzz/text_driver.lua $(BIND_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(FUZZ_LUA) -DFUZZ_TEXT -fsanitize=fuzzer -o $@ $< $(BIND_OBJ) $(WHOLE_LIB) $(LUA_LIB) $(LDLIBS)

# Install missing Debian packages (as root), else print the command to run.
deps:
	@missing=$$(for p in $(DEBS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all Debian packages present"; \
	elif [ "$$(id -u)" = 0 ]; then echo "deps: installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "deps: run as root: apt-get install $$missing"; exit 1; fi

# Python packages for the safetensors interop test (tests/reference), in a venv
# under build/ so that Debian's python3 stays untouched. Installed only when
# missing; without them (no network) the interop test reports itself pending.
PYENV  := $(BUILD)/pyenv
PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
pydeps:
	@if $(PYENV)/bin/python3 -c "import safetensors, numpy, ml_dtypes" 2>/dev/null; then \
	  echo "pydeps: safetensors, numpy, ml-dtypes present in $(PYENV)"; \
	else echo "pydeps: installing safetensors numpy ml-dtypes into $(PYENV)"; mkdir -p $(BUILD); \
	  { rm -rf $(PYENV) && $(PYTHON) -m venv $(PYENV) && \
	    $(PYENV)/bin/python3 -m pip install -q safetensors numpy ml-dtypes; } >$(BUILD)/pydeps.log 2>&1 \
	  || echo "pydeps: install failed (see $(BUILD)/pydeps.log); the interop test will be pending"; fi

test: deps pydeps
	@$(MAKE) --no-print-directory all $(CTEST_BIN) $(PARITY) $(FAKE_CUDA) $(EMU_SO) $(EMU_TEST)
	@BUILD=$(BUILD) SAN=$(SAN) sh tests/run.sh

demo: deps
	@$(MAKE) --no-print-directory all
	$(CLI) scripts/demo.lua
	$(CLI) scripts/train_mlp.lua --epochs 1

# the PyTorch reference rows need Debian's python3-torch (large: only for benchmarks)
bench-deps:
	@if /usr/bin/python3 -c "import torch" 2>/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then echo "bench: installing python3-torch for the reference rows"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null \
	  || echo "bench: python3-torch could not be installed; PyTorch rows will be skipped"; \
	else echo "bench: python3-torch missing (apt-get install python3-torch); PyTorch rows will be skipped"; fi

# Open MPI's own MPI_Allreduce, the reference row of bench_dist.lua
MPI_BENCH := $(if $(MPICC),$(BUILD)/bench/mpi_allreduce)
$(BUILD)/bench/mpi_allreduce: scripts/bench/mpi/allreduce.c
	@mkdir -p $(dir $@)
	$(MPICC) -O2 -o $@ $<

bench: all $(BENCH_BIN) $(MPI_BENCH) bench-deps
	@BUILD=$(BUILD) sh scripts/bench/run.sh

# The GPU benchmarks (scripts/bench/gpu): mpengine against PyTorch on the same GPU,
# as one table; without a GPU they say so and exit 0 (MP_BENCH_SMOKE=1: on the CPU,
# tiny sizes, to check the scripts run)
GPU_BENCH := $(BUILD)/bench/gpu_kernels
$(GPU_BENCH): scripts/bench/gpu/gpu_kernels.c $(LIB) $(wildcard engine/*.h kernels/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O3 -o $@ $< $(WHOLE_LIB) $(LDLIBS)

bench-gpu: all $(GPU_BENCH)
	@BUILD=$(BUILD) sh scripts/bench/gpu/run.sh

# The GPU machine has no Debian packages: build here, gather what the GPU steps
# run and need into gpu-libs/ (stripped, compressed), carry that folder there and
# run scripts/gpu_check.sh (docs/ARCHITECTURE.md, "The GPU check").
gpu-bundle: all $(PARITY) $(GPU_BENCH) $(FAKE_CUDA)
	BUILD=$(BUILD) sh scripts/gpu_bundle.sh

# here (no NVIDIA driver): build, bundle, then the check, which reports "no GPU"
# (MP_GPU_CHECK_FORCE=1: every step anyway, the emulated CUDA device standing in);
# on the GPU machine (a driver, no toolchain): the check alone, on the carried bundle
gpu-check:
	@if [ -e /dev/nvidiactl ] || [ -e /proc/driver/nvidia/version ]; then sh scripts/gpu_check.sh; \
	else $(MAKE) --no-print-directory gpu-bundle $(FAKE_CUDA) $(EMU_SO) && sh scripts/gpu_check.sh; fi

LUADIR  := $(DESTDIR)$(PREFIX)/share/lua/5.4
CLUADIR := $(DESTDIR)$(PREFIX)/lib/lua/5.4
# the API reference, which the REPL's help reads (lua/mp/help.lua looks in
# <prefix>/share/mpengine, three folders up from share/lua/5.4/mp)
DOCDIR  := $(DESTDIR)$(PREFIX)/share/mpengine
# the parts of a module kept in files of their own (lua/mp/amp/*.lua for mp.amp, ...)
LUA_SUBDIRS := $(patsubst lua/mp/%/,%,$(wildcard lua/mp/*/))
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(LUADIR)/mp $(CLUADIR)/mp $(DOCDIR)
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/mpengine
	install -m 644 docs/API.md $(DOCDIR)/API.md
	install -m 644 lua/mp/*.lua $(LUADIR)/mp/
	for d in $(LUA_SUBDIRS); do install -d $(LUADIR)/mp/$$d && install -m 644 lua/mp/$$d/*.lua $(LUADIR)/mp/$$d/ || exit 1; done
	install -m 755 $(CORE) $(CLUADIR)/mp/core.so
	$(if $(CUDA_SO),install -m 755 $(CUDA_SO) $(CLUADIR)/mp/cuda.so)
	$(if $(MPI_SO),install -m 755 $(MPI_SO) $(CLUADIR)/mp/mpi.so)

clean:
	rm -rf $(BUILD)
