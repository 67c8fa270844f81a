// The web console: static pages served by the controller's API server (docs/controller.md,
// "Console"). The files of web/console/ are embedded in the binary at build time
// (cmake/EmbedFiles.cmake); the page holds no data of its own and reads everything through the
// authenticated /v1/ API with the token the user enters.
//
// Served without a token: GET / (redirects to /console/), /console (same), /console/ (the page)
// and /console/FILE (its script, style sheet and icon). Every answer of the server, these and the
// API's, carries X-Content-Type-Options: nosniff and Cache-Control: no-store; the console's
// carry a Content-Security-Policy that allows only the controller's own script, style and images
// (no inline script or style, no other origin, no framing).
#pragma once

#include <string>

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace tf::controller {

// One embedded file (generated source: console_assets.cc).
struct EmbeddedFile {
  const char* path;          // relative to web/console/, e.g. "console.js"
  const char* content_type;
  const unsigned char* data;
  unsigned long size;
};
extern const EmbeddedFile kEmbeddedFiles[];
extern const int kEmbeddedFileCount;

// The Content-Security-Policy of the console's pages.
extern const char kConsoleContentSecurityPolicy[];

// Whether `path` is one of the console's (served without a token).
bool IsConsolePath(const std::string& path);

// Registers the console's GET routes on `server`. Independent of how the server's socket is made
// (plain or TLS).
void RegisterConsoleRoutes(httplib::Server& server);

// Adds the headers every answer carries (above). For Server::set_post_routing_handler.
void AddSecurityHeaders(const httplib::Request& req, httplib::Response& res);

}  // namespace tf::controller
