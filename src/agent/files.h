/*
 * files.h — GET/PUT /v1/files and POST /v1/mkdir (docs/protocol.md §3.5), every path confined by
 * paths.h. Sizes are limited to AGENT_FILE_MAX in both directions, on the descriptor.
 */
#ifndef SANDKIT_AGENT_FILES_H
#define SANDKIT_AGENT_FILES_H

struct evhttp_request;

void files_get(struct evhttp_request *req);
void files_put(struct evhttp_request *req);
void files_mkdir(struct evhttp_request *req);

#endif
