/*
 * files.h — GET/PUT /v1/files, their raw-bytes siblings /v1/files/raw and POST /v1/mkdir
 * (docs/protocol.md §3.5, §6), every path confined by paths.h. The JSON routes are limited to
 * AGENT_FILE_MAX in both directions, on the descriptor; the raw ones have no size limit.
 */
#ifndef SANDKIT_AGENT_FILES_H
#define SANDKIT_AGENT_FILES_H

struct http_request;

void files_get(struct http_request *req);
/* GET/PUT /v1/files/raw (docs/protocol.md §6 rawFiles): the bytes themselves, streamed, with no
 * size limit; a PUT lands in a temporary file renamed over the target once it is whole. */
void files_raw_get(struct http_request *req);
void files_raw_put(struct http_request *req);
void files_put(struct http_request *req);
void files_mkdir(struct http_request *req);

#endif
