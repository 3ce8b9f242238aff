# sandkit — build, test and install.
#
# Nothing here needs editing: every path comes from pkg-config or a variable you can override.
#   make                     builds build/<lua>/sandkit/core.so and build/sandkit-agent
#   make check               installs missing Debian packages, lints, builds, runs the busted suite
#                            under Lua 5.4 and under LuaJIT (test and test-luajit)
#   make check-asan          the same suite with the C core and the agent under ASan + UBSan
#   make demo                runs examples/quickstart.lua against a local session
#   make bench               runs the benchmarks in bench/
#   make install             PREFIX=/usr/local, DESTDIR honoured
#   make LUA_PC=luajit       builds the C core against LuaJIT 2.1's headers (install: the 5.1 tree,
#                            which is where OpenResty and LuaJIT look)

LUA_VERSION ?= 5.4
LUA_PC      ?= lua$(LUA_VERSION)
# LuaJIT speaks Lua 5.1's C API and reads modules from the 5.1 trees.
IS_LUAJIT   := $(filter luajit,$(LUA_PC))
LUA         ?= $(if $(IS_LUAJIT),luajit,lua$(LUA_VERSION))
LUA_ABI     := $(if $(IS_LUAJIT),5.1,$(LUA_VERSION))
PKG_CONFIG  ?= pkg-config
BUSTED      ?= busted

PREFIX  ?= /usr/local
DESTDIR ?=
BINDIR  ?= $(PREFIX)/bin
LUA_CMOD ?= $(PREFIX)/lib/lua/$(LUA_ABI)
LUA_LMOD ?= $(PREFIX)/share/lua/$(LUA_ABI)

CC      ?= cc
CFLAGS  ?= -O2 -g
# The warnings are part of the contract, not a suggestion: they stay on whatever CFLAGS says.
STRICT  := -std=c99 -Wall -Wextra -Werror -Werror=implicit-function-declaration -D_GNU_SOURCE -fPIC
LIBFLAG ?= -shared

# LuaRocks passes LUA_INCDIR; by hand it comes from pkg-config.
ifdef LUA_INCDIR
LUA_CFLAGS ?= -I$(LUA_INCDIR)
else
LUA_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags $(LUA_PC))
endif
CURL_CFLAGS    ?= $(shell $(PKG_CONFIG) --cflags libcurl)
CURL_LIBS      ?= $(shell $(PKG_CONFIG) --libs libcurl)
OPENSSL_CFLAGS ?= $(shell $(PKG_CONFIG) --cflags libcrypto)
OPENSSL_LIBS   ?= $(shell $(PKG_CONFIG) --libs libcrypto)
EVENT_CFLAGS   ?= $(shell $(PKG_CONFIG) --cflags libevent)
EVENT_LIBS     ?= $(shell $(PKG_CONFIG) --libs libevent)

BUILD ?= build
# A LuaRocks build names its headers: objects built for one Lua are never reused for another.
MODDIR := $(BUILD)/$(if $(LUA_INCDIR),$(notdir $(LUA_INCDIR)),$(LUA_PC))
# nginx's Lua module runs LuaJIT, so the nginx specs and gateways need the C module built for it
# too, whatever this build is for (a LuaRocks build makes only the one it was asked for).
JIT_MODDIR := $(BUILD)/luajit
JIT_CORE := $(if $(LUA_INCDIR)$(IS_LUAJIT),,jit-core)

CORE_SRC := src/sandkit_core.c src/base64.c src/json.c src/frames.c src/lua_frames.c \
            src/transfer.c src/lua_transfer.c src/process.c src/sigv4.c src/lua_sigv4.c
CORE_OBJ := $(patsubst src/%.c,$(MODDIR)/obj/%.o,$(CORE_SRC))
CORE_SO  := $(MODDIR)/sandkit/core.so

AGENT_SRC := $(wildcard src/agent/*.c) src/base64.c src/json.c
AGENT_OBJ := $(patsubst src/%.c,$(BUILD)/agent-obj/%.o,$(AGENT_SRC))
AGENT_BIN := $(BUILD)/sandkit-agent

LUA_FILES := $(shell find lua -name '*.lua' | sort)

.PHONY: all deps test test-luajit check check-asan demo bench fuzz install clean lint jit-core

all: $(CORE_SO) $(AGENT_BIN) $(JIT_CORE)

jit-core:
	$(MAKE) LUA_PC=luajit $(JIT_MODDIR)/sandkit/core.so

$(MODDIR)/obj/%.o: src/%.c $(wildcard src/*.h) | $(MODDIR)/obj
	$(CC) $(CFLAGS) $(STRICT) $(LUA_CFLAGS) $(CURL_CFLAGS) $(OPENSSL_CFLAGS) -c $< -o $@

$(CORE_SO): $(CORE_OBJ) | $(MODDIR)/sandkit
	$(CC) $(CFLAGS) $(LDFLAGS) $(LIBFLAG) -o $@ $(CORE_OBJ) $(CURL_LIBS) $(OPENSSL_LIBS) -lm

$(BUILD)/agent-obj/%.o: src/%.c $(wildcard src/*.h src/agent/*.h) | $(BUILD)/agent-obj/agent
	$(CC) $(CFLAGS) $(STRICT) $(EVENT_CFLAGS) -c $< -o $@

$(AGENT_BIN): $(AGENT_OBJ)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(AGENT_OBJ) $(EVENT_LIBS)

$(MODDIR)/obj $(MODDIR)/sandkit $(BUILD)/agent-obj/agent:
	mkdir -p $@

deps:
	@sh tools/bootstrap.sh

# The suite runs against the build tree: the C module from $(MODDIR), the agent from $(BUILD),
# and inside nginx the LuaJIT build of the C module. TEST_PRELOAD and TEST_ENV_EXTRA are set by
# check-asan.
test:
	SANDKIT_AGENT=$(abspath $(AGENT_BIN)) SANDKIT_TEST_LUA=$(LUA) SANDKIT_TEST_CPATH='$(abspath $(MODDIR))/?.so' \
	  SANDKIT_NGINX_CPATH='$(abspath $(JIT_MODDIR))/?.so' \
	  $(if $(TEST_PRELOAD),LD_PRELOAD="$(TEST_PRELOAD)") $(TEST_ENV_EXTRA) \
	  $(BUSTED) --lua=$(LUA) --cpath='$(MODDIR)/?.so' $(BUSTED_ARGS)

# The same suite under LuaJIT (Debian's luajit2, the LuaJIT nginx's Lua module runs).
test-luajit:
	$(MAKE) test LUA_PC=luajit $(if $(TEST_LUAJIT_ARGS),BUSTED_ARGS='$(TEST_LUAJIT_ARGS)')

check: deps
	$(MAKE) lint
	$(MAKE) all
	$(MAKE) test
	$(MAKE) test-luajit

# Lua itself is not instrumented, so the sanitizer runtimes are preloaded; leak checking is off
# because the interpreter keeps its own allocations alive until exit.
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
check-asan: deps
	$(MAKE) all BUILD=build/asan CFLAGS='$(ASAN_FLAGS)' LDFLAGS='-fsanitize=address,undefined'
	$(MAKE) test BUILD=build/asan \
	  TEST_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	  TEST_ENV_EXTRA='ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1'

demo: deps
	$(MAKE) all
	SANDKIT_AGENT=$(abspath $(AGENT_BIN)) LUA_PATH='./lua/?.lua;./lua/?/init.lua;;' \
	  LUA_CPATH='./$(MODDIR)/?.so;;' $(LUA) examples/quickstart.lua

bench:
	@sh tools/bootstrap.sh bench
	$(MAKE) all
	SANDKIT_AGENT=$(abspath $(AGENT_BIN)) SANDKIT_BUILD=$(abspath $(BUILD)) \
	  LUA_PATH='./lua/?.lua;./lua/?/init.lua;;' LUA_CPATH='./$(MODDIR)/?.so;;' $(LUA) bench/run.lua

# libFuzzer over the frame decoder (clang with its runtime, Debian's libclang-rt-14-dev).
FUZZ_SECONDS ?= 60
fuzz:
	mkdir -p $(BUILD)/fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -o $(BUILD)/fuzz/frames_fuzz \
	  tools/fuzz/frames_fuzz.c src/frames.c src/json.c src/base64.c
	cp -r tools/fuzz/corpus $(BUILD)/fuzz/corpus
	$(BUILD)/fuzz/frames_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=8192 $(BUILD)/fuzz/corpus

lint:
	luacheck --no-color lua spec bin examples bench

# The `sandkit` command runs under the interpreter this build is for; on the 5.1 ABI that is
# LuaJIT, since sandkit needs more than PUC Lua 5.1 offers (LuaRocks passes LUA=…/lua5.1).
RUN_LUA := $(if $(filter 5.1,$(LUA_ABI))$(findstring 5.1,$(notdir $(LUA))),luajit,$(notdir $(LUA)))

install: all
	install -d $(DESTDIR)$(LUA_CMOD)/sandkit $(DESTDIR)$(BINDIR)
	install -m 0755 $(CORE_SO) $(DESTDIR)$(LUA_CMOD)/sandkit/core.so
	for f in $(LUA_FILES); do \
	  d=$(DESTDIR)$(LUA_LMOD)/$$(dirname $${f#lua/}); install -d $$d && install -m 0644 $$f $$d/; \
	done
	install -m 0755 $(AGENT_BIN) $(DESTDIR)$(BINDIR)/sandkit-agent
	sed '1s|^#!.*|#!/usr/bin/env $(RUN_LUA)|' bin/sandkit >$(DESTDIR)$(BINDIR)/sandkit
	chmod 0755 $(DESTDIR)$(BINDIR)/sandkit

clean:
	rm -rf build
