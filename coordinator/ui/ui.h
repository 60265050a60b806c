/*
 * ui.h - the web console's static files, built into the coordinator
 * (coordinator/ui/, embedded by embed.cmake) and served under /ui/
 * (http.c). docs/console.md.
 */
#ifndef LYNX_UI_H
#define LYNX_UI_H

#include <stddef.h>

struct lynx_ui_file {
  const char *name; /* "index.html": the path after /ui/ */
  const char *type; /* its Content-Type */
  const unsigned char *data;
  size_t len;
};

/* Every file, then an entry whose name is NULL. */
extern const struct lynx_ui_file lynx_ui_files[];

#endif
