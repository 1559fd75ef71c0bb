# Thin front end over CMake.
#   make         install missing Debian packages, configure and build (build/)
#   make run     build and run the main job (the example trainer's default run)
#   make test    build and run the whole test suite through CTest
#   make llama-cpp  build llama.cpp's tools for tests/py/test_llamacpp_interop.py (cached in $(BUILD)/llama.cpp)
#   make clean   remove build/
BUILD   ?= build
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test clean bench llama-cpp

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	@scripts/install-deps.sh --build
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	@scripts/run-main.sh $(BUILD)

test: deps configure
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

llama-cpp:
	@scripts/build-llama-cpp.sh $(BUILD)

clean:
	rm -rf $(BUILD)
