/*
 * dashboard: the live HTML page of GET /dashboard (dashboard.c says what it shows and how it is read).
 */
#ifndef WAFER_SERVER_DASHBOARD_H
#define WAFER_SERVER_DASHBOARD_H

#include <stddef.h>

/* The page (static storage) and its length. */
const char *dashboard_html(size_t *len);

#endif
