# sandkit — build, test and install.
#
# Nothing here needs editing: every path comes from pkg-config or a variable you can override.
#   make                     builds build/<lua>/sandkit/core.so and tar.so (for Lua 5.4 and for LuaJIT),
#                            build/sandkit-agent and build/sandkit-init
#   make agent               builds build/sandkit-agent alone: a C compiler, libevent's,
#                            libcrypto's and libarchive's headers, no Lua or libcurl
#                            (deploy/agent/Containerfile)
#   make check               installs missing Debian packages, lints, builds, replays the fuzz
#                            targets' seeds (fuzz-seeds), runs the busted suite under Lua 5.4
#                            and, where the interpreter matters, under LuaJIT, its spec files
#                            concurrently (test-parallel)
#   make test                the Lua 5.4 pass alone, one file after another (BUSTED_ARGS: files)
#   make test-luajit         the LuaJIT pass alone, likewise (TEST_LUAJIT_ARGS: files)
#   make test-times          both passes one after the other, with each spec file's and case's time
#   make rock                packs build/sandkit-scm-1.src.rock from the files git tracks
#   make check-asan          the same suite with the C core and the agent under ASan + UBSan
#   make demo                installs what the demo needs, builds, runs examples/quickstart.lua
#                            against a local session
#   make kube-example        runs examples/kubernetes.lua against the specs' fake cluster
#   make bench               runs the benchmarks in bench/
#   make fuzz                runs every libFuzzer target in tools/fuzz/
#   make abuse               attacks a real agent (tools/abuse/) and reports what it cost
#   make soak                a thousand commands, clients killed mid-stream, leaks counted (tools/soak/)
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
# The warnings are part of the contract, not a suggestion: they stay on whatever CFLAGS says,
# and are errors here and in CI. A user's `luarocks make` passes WERROR= (see the rockspec):
# a newer compiler's new warning must not stop someone else's install.
WERROR  ?= -Werror
STRICT  := -std=c99 -Wall -Wextra $(WERROR) -Werror=implicit-function-declaration -D_GNU_SOURCE -fPIC
LIBFLAG ?= -shared

# $(call pkg_config_once,VAR,ARGS): pkg-config's answer for VAR, asked when VAR is first used and
# kept: a variable of `$(shell …)` alone would ask again at every compile command that names it
# (hundreds of runs of pkg-config a build), and one asked at once would ask for libraries a target
# does not use (`make agent` builds where libcurl is not installed).
pkg_config_once = $(eval $(1) := $$(shell $(PKG_CONFIG) $(2)))$($(1))

# LuaRocks passes LUA_INCDIR; by hand it comes from pkg-config.
ifdef LUA_INCDIR
LUA_CFLAGS ?= -I$(LUA_INCDIR)
else
LUA_CFLAGS ?= $(call pkg_config_once,LUA_CFLAGS,--cflags $(LUA_PC))
endif
CURL_CFLAGS    ?= $(call pkg_config_once,CURL_CFLAGS,--cflags libcurl)
CURL_LIBS      ?= $(call pkg_config_once,CURL_LIBS,--libs libcurl)
OPENSSL_CFLAGS ?= $(call pkg_config_once,OPENSSL_CFLAGS,--cflags libcrypto)
OPENSSL_LIBS   ?= $(call pkg_config_once,OPENSSL_LIBS,--libs libcrypto)
EVENT_CFLAGS   ?= $(call pkg_config_once,EVENT_CFLAGS,--cflags libevent)
EVENT_LIBS     ?= $(call pkg_config_once,EVENT_LIBS,--libs libevent)
# libarchive writes and reads the tar streams of whole directories (src/common/tarstream.c), in
# the agent and in the C core alike.
ARCHIVE_CFLAGS ?= $(call pkg_config_once,ARCHIVE_CFLAGS,--cflags libarchive)
ARCHIVE_LIBS   ?= $(call pkg_config_once,ARCHIVE_LIBS,--libs libarchive)

BUILD ?= build
# The C core's folder is named after the Lua whose headers it is compiled against (lua5.4,
# luajit, …), asked of the headers themselves: LuaRocks passes LUA_INCDIR and nothing else, so
# a name taken from LUA_PC would put a build for one Lua where another's is looked for.
LUA_NAME := $(patsubst lua50%,lua5.%,$(shell printf '\043include <lua.h>\n\043if __has_include(<luajit.h>)\nSANDKIT_LUA luajit\n\043else\nSANDKIT_LUA lua LUA_VERSION_NUM\n\043endif\n' \
  | $(CC) $(LUA_CFLAGS) -E -P -x c - 2>/dev/null | sed -n 's/^SANDKIT_LUA //p' | tr -d ' '))
MODDIR := $(BUILD)/$(or $(LUA_NAME),$(LUA_PC))
# nginx's Lua module runs LuaJIT, so the nginx specs and gateways need the C module built for it
# too, whatever this build is for (a LuaRocks build makes only the one it was asked for). A
# machine without LuaJIT's headers builds for its own Lua alone.
JIT_MODDIR := $(BUILD)/luajit
HAVE_LUAJIT := $(shell $(PKG_CONFIG) --exists luajit && echo yes)
JIT_CORE := $(if $(LUA_INCDIR)$(IS_LUAJIT),,$(if $(HAVE_LUAJIT),jit-core))

# src/common/ is plain C with no Lua in it (compiled without Lua's headers, so it stays that way),
# linked by the C core and the agent alike; src/*.c is the core's Lua bindings; src/agent/ the
# agent. Sources name headers from src/: "common/json.h".
SRC_CFLAGS := -Isrc
COMMON_H := $(wildcard src/common/*.h)

CORE_SRC := src/sandkit_core.c src/lua_frames.c src/lua_transfer.c src/process.c src/terminal.c src/lua_sigv4.c \
            src/signals.c src/lua_ed25519.c src/lua_fslist.c \
            src/common/base64.c src/common/json.c src/common/json_unique.c src/common/frames.c \
            src/common/transfer.c src/common/sigv4.c src/common/ed25519.c src/common/regular_file.c \
            src/common/walk.c src/common/tree_remove.c
# The C module sandkit.tar: a directory as a tar stream, over libarchive, which only it links,
# so that libarchive's libraries load in the programs that move trees and in no other.
TAR_SRC := src/lua_tar.c src/common/tarstream.c src/common/walk.c src/common/tree_remove.c src/common/beneath.c
# src/common/'s objects are compiled once, in $(COMMON_OBJDIR), for the C core of every Lua and
# for the agent alike: they hold no Lua, and the same flags make the same object.
COMMON_OBJDIR := $(BUILD)/common-obj
common_obj = $(patsubst src/common/%.c,$(COMMON_OBJDIR)/%.o,$(filter src/common/%,$(1)))
CORE_COMMON_OBJ := $(call common_obj,$(CORE_SRC) $(TAR_SRC))
CORE_OBJ := $(patsubst src/%.c,$(MODDIR)/obj/%.o,$(filter-out src/common/%,$(CORE_SRC))) $(call common_obj,$(CORE_SRC))
CORE_SO  := $(MODDIR)/sandkit/core.so
TAR_OBJ  := $(patsubst src/%.c,$(MODDIR)/obj/%.o,$(filter-out src/common/%,$(TAR_SRC))) $(call common_obj,$(TAR_SRC))
TAR_SO   := $(MODDIR)/sandkit/tar.so

AGENT_SRC := $(wildcard src/agent/*.c) src/common/base64.c src/common/json.c src/common/ed25519.c \
             src/common/regular_file.c src/common/walk.c src/common/tree_remove.c src/common/tarstream.c \
             src/common/beneath.c src/common/reaper.c
AGENT_OBJ := $(patsubst src/%.c,$(BUILD)/agent-obj/%.o,$(filter-out src/common/%,$(AGENT_SRC))) \
             $(call common_obj,$(AGENT_SRC))
AGENT_BIN := $(BUILD)/sandkit-agent
# Process 1 of a confined session (src/init/init.c), beside the agent, which looks for it there.
# Static: it runs inside the session's own root, whatever C library that root holds or lacks. Its
# flags are its own, so a sanitizer build of the rest leaves it plain (the sanitizers cannot link
# statically).
INIT_BIN := $(BUILD)/sandkit-init
INIT_CFLAGS ?= -O2

LUA_FILES := $(shell find lua -name '*.lua' 2>/dev/null | sort)
# Their folders, and the files of one of them: install copies a folder's files in one command.
LUA_DIRS := $(sort $(dir $(LUA_FILES)))
lua_files_in = $(foreach f,$(LUA_FILES),$(if $(filter $(1),$(dir $(f))),$(f)))

.PHONY: all agent kube-example deps test test-luajit test-parallel once-specs-exist test-times check check-asan demo bench fuzz fuzz-seeds abuse soak install clean lint rock \
        jit-core

all: $(CORE_SO) $(TAR_SO) $(AGENT_BIN) $(INIT_BIN) $(JIT_CORE)

# The common objects first, here: the make below would otherwise compile them at the same time
# as this one, into the same files.
jit-core: $(CORE_COMMON_OBJ)
	$(MAKE) LUA_PC=luajit $(JIT_MODDIR)/sandkit/core.so $(JIT_MODDIR)/sandkit/tar.so

agent: $(AGENT_BIN)

$(MODDIR)/obj/%.o: src/%.c $(wildcard src/*.h) $(COMMON_H) | $(MODDIR)/obj
	$(CC) $(CFLAGS) $(STRICT) $(SRC_CFLAGS) $(LUA_CFLAGS) $(CURL_CFLAGS) $(OPENSSL_CFLAGS) $(ARCHIVE_CFLAGS) -c $< -o $@

$(COMMON_OBJDIR)/%.o: src/common/%.c $(COMMON_H) | $(COMMON_OBJDIR)
	$(CC) $(CFLAGS) $(STRICT) $(SRC_CFLAGS) $(COMMON_CURL_CFLAGS) $(OPENSSL_CFLAGS) $(ARCHIVE_CFLAGS) -c $< -o $@

# libcurl's headers for the one common file that uses them, the core's: `make agent` builds where
# they are not installed.
$(COMMON_OBJDIR)/transfer.o: COMMON_CURL_CFLAGS = $(CURL_CFLAGS)

$(CORE_SO): $(CORE_OBJ) | $(MODDIR)/sandkit
	$(CC) $(CFLAGS) $(LDFLAGS) $(LIBFLAG) -o $@ $(CORE_OBJ) $(CURL_LIBS) $(OPENSSL_LIBS) -lm

$(TAR_SO): $(TAR_OBJ) | $(MODDIR)/sandkit
	$(CC) $(CFLAGS) $(LDFLAGS) $(LIBFLAG) -o $@ $(TAR_OBJ) $(ARCHIVE_LIBS)

$(BUILD)/agent-obj/%.o: src/%.c $(wildcard src/agent/*.h) $(COMMON_H) | $(BUILD)/agent-obj/agent
	$(CC) $(CFLAGS) $(STRICT) $(SRC_CFLAGS) $(EVENT_CFLAGS) $(OPENSSL_CFLAGS) $(ARCHIVE_CFLAGS) -c $< -o $@

# libcrypto verifies capability tokens (src/agent/capability.c, Ed25519). libarchive, which
# carries directories (src/agent/fs_tar.c), is not linked: the agent opens it on its first
# directory transfer (src/agent/archive_loader.h), as its libraries would double every start.
$(AGENT_BIN): $(AGENT_OBJ)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(AGENT_OBJ) $(EVENT_LIBS) $(OPENSSL_LIBS)

$(INIT_BIN): src/init/init.c src/common/reaper.c src/common/reaper.h | $(BUILD)/agent-obj/agent
	$(CC) $(INIT_CFLAGS) -static -std=c99 -Wall -Wextra $(WERROR) $(SRC_CFLAGS) -o $@ src/init/init.c src/common/reaper.c

$(MODDIR)/obj $(MODDIR)/sandkit $(BUILD)/agent-obj/agent $(COMMON_OBJDIR):
	mkdir -p $@

# The packages make check needs (tools/bootstrap.sh: `--list check` names them); make demo and
# make bench install their own sets.
deps:
	@sh tools/bootstrap.sh check

# The suite runs against the build tree: the C module from $(MODDIR), the agent from $(BUILD),
# and inside nginx the LuaJIT build of the C module. busted_for is busted with that environment
# under the interpreter $(1) and the C module built in $(2). TEST_PRELOAD and TEST_ENV_EXTRA are
# set by check-asan. `make test` runs every spec under $(LUA), one file after another
# (BUSTED_ARGS chooses files instead).
busted_for = SANDKIT_AGENT=$(abspath $(AGENT_BIN)) SANDKIT_TEST_LUA=$(1) SANDKIT_TEST_CPATH='$(abspath $(2))/?.so' \
  SANDKIT_NGINX_CPATH='$(abspath $(JIT_MODDIR))/?.so' $(BUSTED) --lua=$(1) --cpath='$(2)/?.so'
test:
	$(if $(TEST_PRELOAD),LD_PRELOAD="$(TEST_PRELOAD)") $(TEST_ENV_EXTRA) $(call busted_for,$(LUA),$(MODDIR)) $(BUSTED_ARGS)

# Specs whose outcome does not depend on the interpreter running busted. `make check` runs them
# once, in the Lua 5.4 pass, and every other spec under both Lua 5.4 and LuaJIT: a spec file not
# named here runs twice, so a new one is never left out of either pass.
#   agent_*_spec.lua, agent_spec.lua: the C agent, driven over sockets; Lua only builds the
#     requests (the tokens sandkit mints are checked by real agents in the kubernetes specs);
#     agent_containerfile_spec.lua builds it as its image does and reads what it links against.
#   nginx_*_spec.lua, openresty_example_spec.lua: the client runs inside nginx's Lua module,
#     which is LuaJIT whatever runs busted; busted's side only sends HTTP to nginx.
#   packaging_spec.lua, packaging_rock_spec.lua, packaging_rock_luajit_spec.lua: build and install
#     for Lua 5.4 and for the 5.1 ABI by name.
#   local_image_build_spec.lua: mmdebstrap builds a Debian system, a minute or two, and the
#     interpreter only asks for it.
#   suite_spec.lua: reads the spec files' text.
ONCE_SPECS := spec/agent_abuse_spec.lua spec/agent_capability_spec.lua spec/agent_confine_spec.lua \
              spec/agent_containerfile_spec.lua \
              spec/agent_containment_spec.lua spec/agent_errors_spec.lua spec/agent_extensions_spec.lua \
              spec/agent_fs_spec.lua spec/agent_http_spec.lua spec/agent_lifetime_spec.lua spec/agent_spec.lua \
              spec/nginx_collector_spec.lua spec/nginx_handle_spec.lua spec/nginx_kubernetes_spec.lua \
              spec/nginx_protocol_spec.lua \
              spec/nginx_providers_spec.lua spec/nginx_text_stream_spec.lua spec/nginx_transport_spec.lua \
              spec/nginx_worker_spec.lua spec/openresty_example_spec.lua \
              spec/packaging_spec.lua spec/packaging_rock_spec.lua spec/packaging_rock_luajit_spec.lua \
              spec/local_image_build_spec.lua spec/suite_spec.lua
BOTH_SPECS := $(filter-out $(ONCE_SPECS),$(sort $(wildcard spec/*_spec.lua)))

# The specs of both passes under LuaJIT (Debian's luajit2, the LuaJIT nginx's Lua module runs);
# TEST_LUAJIT_ARGS chooses files instead. Every spec under LuaJIT: make test LUA_PC=luajit.
test-luajit: once-specs-exist
	$(MAKE) test LUA_PC=luajit BUSTED_ARGS='$(or $(TEST_LUAJIT_ARGS),$(BOTH_SPECS))'

once-specs-exist:
	@for f in $(ONCE_SPECS) $(ALONE_SPECS); do [ -f "$$f" ] || { echo "Makefile: $$f is named but gone" >&2; exit 1; }; done

# Specs whose bound is a timing behaviour of their own (a latency percentile, how long
# concurrent sleeps take), which the rest of the suite running beside them would measure too:
# test-parallel runs them one at a time once only light files are left (a few CPU seconds each
# when last recorded), with one of those beside them at most. cli_interactive_spec plays a
# terminal whose keystrokes wait on bounded reads of a shell's echo, which a loaded machine
# stretches past them.
ALONE_SPECS := spec/nginx_worker_spec.lua spec/cli_interactive_spec.lua

# Both passes of check at once: every spec file under Lua 5.4 and BOTH_SPECS under LuaJIT, each
# file its own busted process, TEST_JOBS of them at a time and one more while cores stay idle
# (every file running waiting at once), the slowest first (by the times
# the last run recorded in $(BUILD)/spec_times.txt, else tools/spec_times.txt), and ALONE_SPECS
# once the heavy files are done, beside one light file at most (tools/run_specs.lua). Most of the suite waits on processes and sockets, so a file runs
# in a fraction of a core; each file makes its own ports, folders, nginx prefixes and agents, so
# files do not meet. Each file's output is kept in $(BUILD)/spec-logs/<pass>/; the failed ones
# are printed at the end, named, and fail the target. Refresh the committed times with
# `cp $(BUILD)/spec_times.txt tools/spec_times.txt` when files are added or change much.
# One file a core and one more: a file waits on its processes and sockets about as long as it
# computes, and two a core loaded the machine past the bounds some specs keep on purpose.
TEST_JOBS ?= $(shell echo $$(($$(nproc 2>/dev/null || echo 1) + 1)))
test-parallel: once-specs-exist
	$(LUA) tools/run_specs.lua --jobs $(TEST_JOBS) --logs $(BUILD)/spec-logs \
	  --times $(BUILD)/spec_times.txt --times tools/spec_times.txt --record $(BUILD)/spec_times.txt \
	  --alone $(ALONE_SPECS) \
	  --pass $(notdir $(LUA)) "$(call busted_for,$(LUA),$(MODDIR))" $(sort $(wildcard spec/*_spec.lua)) \
	  --pass luajit "$(call busted_for,luajit,$(JIT_MODDIR))" $(BOTH_SPECS)

# The build runs a compiler a core, and the lint and the fuzz targets' seeds, which need no
# build, as one of them each; the tests run as test-parallel.
CHECK_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
check: deps
	$(MAKE) -j$(CHECK_JOBS) lint fuzz-seeds all
	$(MAKE) test-parallel

# Both passes of check, each reporting how long each spec file and each case took, and their CPU
# seconds, slowest first (tools/test_times.lua), and failing if either failed.
TIMES_OUTPUT := -o tools/test_times.lua
test-times: all
	status=0; \
	$(MAKE) test BUSTED_ARGS='$(TIMES_OUTPUT) $(BUSTED_ARGS)' || status=1; \
	$(MAKE) test-luajit TEST_LUAJIT_ARGS='$(TIMES_OUTPUT) $(or $(TEST_LUAJIT_ARGS),$(BOTH_SPECS))' || status=1; \
	exit $$status

# Lua itself is not instrumented, so the sanitizer runtimes are preloaded; leak checking is off
# because the interpreter keeps its own allocations alive until exit.
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
check-asan: deps
	$(MAKE) all BUILD=build/asan CFLAGS='$(ASAN_FLAGS)' LDFLAGS='-fsanitize=address,undefined'
	$(MAKE) test BUILD=build/asan \
	  TEST_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	  TEST_ENV_EXTRA='ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1'

# Only what the demo needs: the build and a local session (`tools/bootstrap.sh --list demo`).
demo:
	@sh tools/bootstrap.sh demo
	$(MAKE) all
	SANDKIT_AGENT=$(abspath $(AGENT_BIN)) LUA_PATH='./lua/?.lua;./lua/?/init.lua;;' \
	  LUA_CPATH='./$(MODDIR)/?.so;;' $(LUA) examples/quickstart.lua

# examples/kubernetes.lua against the specs' fake cluster (tools/fake_cluster.lua), no real one.
kube-example: all
	SANDKIT_AGENT=$(abspath $(AGENT_BIN)) SANDKIT_TEST_LUA=$(LUA) LUA_PATH='./lua/?.lua;./lua/?/init.lua;./spec/?.lua;;' \
	  LUA_CPATH='./$(MODDIR)/?.so;;' $(LUA) tools/fake_cluster.lua \
	  $(LUA) examples/kubernetes.lua @pool@ @key@ @key_id@ @namespace@

bench:
	@sh tools/bootstrap.sh bench
	$(MAKE) all
	SANDKIT_AGENT=$(abspath $(AGENT_BIN)) SANDKIT_BUILD=$(abspath $(BUILD)) \
	  LUA_PATH='./lua/?.lua;./lua/?/init.lua;;' LUA_CPATH='./$(MODDIR)/?.so;;' $(LUA) bench/run.lua

# The attacks of docs/agent.md against a real agent, with its memory, descriptors, CPU and the
# latency of authorized execs meanwhile (tools/abuse/RESULTS.md). Not part of make check: it
# takes about a minute and 2000 connections; the attacker needs descriptors for them.
abuse: all
	ulimit -n 8192 && SANDKIT_AGENT=$(abspath $(AGENT_BIN)) SANDKIT_TEST_LUA=$(LUA) \
	  LUA_PATH='./spec/?.lua;./lua/?.lua;./lua/?/init.lua;;' LUA_CPATH='./$(MODDIR)/?.so;;' \
	  $(LUA) tools/abuse/run.lua

# libFuzzer (clang with its runtime, Debian's libclang-rt-14-dev) over every target
# tools/fuzz/NAME_fuzz.c, each starting from its corpus tools/fuzz/corpus/NAME/. A target names
# the sources it needs on a " * sources:" line of its header comment, compiler definitions on an
# optional " * defines:" line, libraries on an optional " * libs:" line and libFuzzer options on a
# " * options:" line, so adding one needs no change here. New inputs go to $(BUILD)/fuzz/corpus;
# fold them into the repository's with: $(BUILD)/fuzz/NAME -merge=1 tools/fuzz/corpus/NAME $(BUILD)/fuzz/corpus/NAME
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= $(patsubst tools/fuzz/%_fuzz.c,%,$(wildcard tools/fuzz/*_fuzz.c))
# -fno-sanitize-recover: UBSan's reports end the run (and fail make fuzz) as ASan's do, instead
# of being printed and passed over.
FUZZ_FLAGS   := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -D_GNU_SOURCE \
                $(SRC_CFLAGS)
fuzz_field = $(shell sed -n 's/^ \* $(2): //p' tools/fuzz/$(1)_fuzz.c)
# Every target built by the C compiler without libFuzzer (tools/fuzz/replay.c calls it once
# per file) and run over its committed corpus, which holds the inputs that once found
# something: part of check, so that a target no longer building or rejecting one of them fails
# there. Unoptimised: the seeds take moments, the compiles most of the time.
FUZZ_SEEDS_DIR := $(BUILD)/fuzz-seeds
fuzz-seeds:
	@mkdir -p $(FUZZ_SEEDS_DIR)
	@$(foreach t,$(FUZZ_TARGETS),\
	  $(CC) -std=c99 -g -O0 -Wall -Wextra $(WERROR) -D_GNU_SOURCE $(SRC_CFLAGS) $(call fuzz_field,$(t),defines) \
	    -o $(FUZZ_SEEDS_DIR)/$(t) tools/fuzz/replay.c tools/fuzz/$(t)_fuzz.c $(call fuzz_field,$(t),sources) \
	    $(call fuzz_field,$(t),libs) && \
	  $(FUZZ_SEEDS_DIR)/$(t) tools/fuzz/corpus/$(t)/* &&) true
fuzz:
	mkdir -p $(BUILD)/fuzz
	$(foreach t,$(FUZZ_TARGETS),\
	  clang $(FUZZ_FLAGS) $(call fuzz_field,$(t),defines) -o $(BUILD)/fuzz/$(t) tools/fuzz/$(t)_fuzz.c \
	    $(call fuzz_field,$(t),sources) $(call fuzz_field,$(t),libs) && \
	  mkdir -p $(BUILD)/fuzz/corpus/$(t) && \
	  $(BUILD)/fuzz/$(t) -max_total_time=$(FUZZ_SECONDS) $(call fuzz_field,$(t),options) $(FUZZ_ARGS) \
	    $(BUILD)/fuzz/corpus/$(t) tools/fuzz/corpus/$(t) &&) true

# 1000 commands across 32 local sessions, clients killed mid-stream, leaks counted from /proc;
# writes tools/soak/RESULTS.md. Not part of check: it takes a minute and two cores.
soak:
	$(MAKE) all
	SANDKIT_AGENT=$(abspath $(AGENT_BIN)) LUA_PATH='./spec/?.lua;./lua/?.lua;./lua/?/init.lua;;' \
	  LUA_CPATH='./$(MODDIR)/?.so;;' $(LUA) tools/soak/soak.lua --results tools/soak/RESULTS.md

lint:
	luacheck --no-color lua spec bin examples bench tools

# The `sandkit` command runs under the interpreter this build is for; on the 5.1 ABI that is
# LuaJIT, since sandkit needs more than PUC Lua 5.1 offers (LuaRocks passes LUA=…/lua5.1).
RUN_LUA := $(if $(filter 5.1,$(LUA_ABI))$(findstring 5.1,$(notdir $(LUA))),luajit,$(notdir $(LUA)))

# The installed command looks for its modules where they were installed first (bin/sandkit):
# this line of it is where install writes their folders, and install fails if it is gone.
INSTALLED_DIRS_LINE := local INSTALLED_LUA_DIR, INSTALLED_C_DIR = nil, nil

install: all
	install -d $(DESTDIR)$(LUA_CMOD)/sandkit $(DESTDIR)$(BINDIR)
	install -m 0755 $(CORE_SO) $(DESTDIR)$(LUA_CMOD)/sandkit/core.so
	install -m 0755 $(TAR_SO) $(DESTDIR)$(LUA_CMOD)/sandkit/tar.so
	$(foreach d,$(LUA_DIRS),install -d $(DESTDIR)$(LUA_LMOD)/$(d:lua/%=%) && \
	  install -m 0644 $(call lua_files_in,$(d)) $(DESTDIR)$(LUA_LMOD)/$(d:lua/%=%) &&) true
	install -m 0755 $(AGENT_BIN) $(DESTDIR)$(BINDIR)/sandkit-agent
	install -m 0755 $(INIT_BIN) $(DESTDIR)$(BINDIR)/sandkit-init
	sed -e '1s|^#!.*|#!/usr/bin/env $(RUN_LUA)|' \
	  -e 's|^$(INSTALLED_DIRS_LINE)$$|local INSTALLED_LUA_DIR, INSTALLED_C_DIR = [==[$(abspath $(LUA_LMOD))]==], [==[$(abspath $(LUA_CMOD))]==]|' \
	  bin/sandkit >$(DESTDIR)$(BINDIR)/sandkit
	grep -q '^local INSTALLED_LUA_DIR, INSTALLED_C_DIR = \[' $(DESTDIR)$(BINDIR)/sandkit
	chmod 0755 $(DESTDIR)$(BINDIR)/sandkit

# A source rock as `luarocks pack` would make it, without fetching: the rockspec and the
# tracked files under sandkit/ (the folder LuaRocks looks for, named after source.url).
# `luarocks install build/sandkit-scm-1.src.rock` then builds it with no network.
ROCK := $(BUILD)/sandkit-scm-1.src.rock
rock:
	rm -rf $(BUILD)/rock $(ROCK)
	mkdir -p $(BUILD)/rock/sandkit
	git ls-files -z | tar --null -T - -cf - | tar -xf - -C $(BUILD)/rock/sandkit
	cp sandkit-scm-1.rockspec $(BUILD)/rock/
	cd $(BUILD)/rock && zip -qr $(abspath $(ROCK)) sandkit-scm-1.rockspec sandkit
	rm -rf $(BUILD)/rock
	@echo $(ROCK)

clean:
	rm -rf build
