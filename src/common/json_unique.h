/*
 * json_unique.h — whether any object of a JSON text names a member twice.
 *
 * JSON readers disagree about a repeated member: lua-cjson keeps the last copy, others the
 * first, the agent and the frame decoder refuse it. A text two readers read differently is no
 * answer at all ({"t":"error","t":"exit"} is a failure to one and a success to another), so
 * the client checks every JSON answer of the agent with this before decoding it.
 *
 * Names compare by the value they spell: "t" and "\u0074" are the same name. The text is read
 * by json.c's rules, its nesting bound (SK_JSON_MAX_DEPTH) included.
 */
#ifndef SANDKIT_JSON_UNIQUE_H
#define SANDKIT_JSON_UNIQUE_H

#include <stddef.h>

#include "json.h"

enum sk_json_unique_result {
	SK_JSON_UNIQUE_NO_MEMORY = -2,
	SK_JSON_UNIQUE_UNREADABLE = -1, /* not one JSON value by json.c's rules */
	SK_JSON_UNIQUE_OK = 0,          /* every object names each member once */
	SK_JSON_UNIQUE_REPEATED = 1     /* an object names a member twice */
};

typedef struct sk_json_unique_report {
	sk_json_str name; /* REPEATED: the later of two equal names, as a span of the text */
	size_t at;        /* REPEATED: offset of that name's opening quote; UNREADABLE: of the failure */
	const char *err;  /* UNREADABLE: json.c's static text of why */
} sk_json_unique_report;

/* Reads the whole text; stops at the first object found naming a member twice. */
enum sk_json_unique_result sk_json_unique(const char *text, size_t len, sk_json_unique_report *out);

#endif
