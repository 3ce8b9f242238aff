/*
 * archive_loader.h — libarchive, loaded by the agent on its first directory transfer.
 *
 * libarchive brings libxml2, ICU and libstdc++ with it (for formats the agent never reads);
 * linked, the dynamic loader maps and relocates them at every start, about as much CPU as the
 * rest of the agent's start. The agent links none of it: archive_loader.c defines the libarchive
 * functions common/tarstream.c calls, each forwarding to the library once archive_loader_load()
 * opened it. The C module sandkit.tar links libarchive itself and shares tarstream.c unchanged.
 */
#ifndef SANDKIT_AGENT_ARCHIVE_LOADER_H
#define SANDKIT_AGENT_ARCHIVE_LOADER_H

/* Opens libarchive the first time; NULL once every function tarstream.c calls was found, else
 * why not (the loader's own words, for a reply). A failure is kept: the next call says the same
 * without looking again. The only way into common/tarstream.h's functions in the agent. */
const char *archive_loader_load(void);

#endif
