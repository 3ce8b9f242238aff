/*
 * sandkit_core.h — how the pieces of the sandkit.core Lua module register themselves.
 * Each skl_open_* adds its functions to the module table on top of the stack.
 */
#ifndef SANDKIT_CORE_H
#define SANDKIT_CORE_H

#include "compat.h"

#define SANDKIT_VERSION "0.1.0"
/* Bumped whenever the Lua layer and the C core stop fitting each other; init.lua checks it. */
#define SANDKIT_ABI 1

void skl_open_frames(lua_State *L);   /* frames.c glue: decoder, base64, json_unique */
void skl_open_transfer(lua_State *L); /* transfer.c glue: client, request, wait */
void skl_open_process(lua_State *L);  /* process.c: spawn, signals, files */
/* The descriptor of the core.create_new file at idx; -1 when idx holds something else (raises
 * when it is one that was closed). */
int skl_new_file_fd(lua_State *L, int idx);
void skl_open_sigv4(lua_State *L);    /* sigv4.c glue: sigv4 */
void skl_open_signals(lua_State *L);  /* signals.c: trap, caught */
void skl_open_terminal(lua_State *L); /* terminal.c: raw mode, size, reading what is ready */
/* The read end of the pipe a trapped signal writes to, or -1 before any core.trap: core.wait
 * and core.poll watch it so a trapped signal ends their wait. */
int skl_signal_fd(void);
void skl_open_ed25519(lua_State *L);  /* ed25519.c glue: keys, signing, verifying */
void skl_open_fslist(lua_State *L);   /* a listing's page read into entries */

struct sk_frame;
struct sk_frames;
/* Pushes one decoded frame as the table the Lua layer hands to callers. */
void skl_push_frame(lua_State *L, int decoder, const struct sk_frame *f);
/* The decoder userdata at idx (raises when it is not one, or is closed). */
struct sk_frames *skl_check_decoder(lua_State *L, int idx);
/* Pushes nil, the failure kind ("unparsable", "undecodable", "too_long", "no_memory") and the
 * decoder's sentence: the three results of a decode that failed. */
int skl_push_decoder_failure(lua_State *L, const struct sk_frames *d);

#endif
