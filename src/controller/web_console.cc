#include "controller/web_console.h"

#include <httplib.h>

#include <string_view>

namespace tf::controller {

const char kConsoleContentSecurityPolicy[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

namespace {

const EmbeddedFile* FindFile(std::string_view path) {
  for (int i = 0; i < kEmbeddedFileCount; ++i)
    if (path == kEmbeddedFiles[i].path) return &kEmbeddedFiles[i];
  return nullptr;
}

void Redirect(httplib::Response& res) {
  res.status = 302;
  res.set_header("Location", "/console/");
}

}  // namespace

bool IsConsolePath(const std::string& path) {
  return path == "/" || path == "/console" || path.rfind("/console/", 0) == 0;
}

void RegisterConsoleRoutes(httplib::Server& s) {
  s.Get("/", [](const httplib::Request&, httplib::Response& res) { Redirect(res); });
  s.Get("/console", [](const httplib::Request&, httplib::Response& res) { Redirect(res); });
  s.Get(R"(/console/([A-Za-z0-9._-]*))", [](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1].length() == 0 ? "index.html" : std::string(req.matches[1]);
    const EmbeddedFile* f = FindFile(name);
    if (f == nullptr) {
      res.status = 404;
      res.set_content("not found: " + req.path + "\n", "text/plain; charset=utf-8");
      return;
    }
    res.set_content(reinterpret_cast<const char*>(f->data), f->size, f->content_type);
  });
}

void AddSecurityHeaders(const httplib::Request& req, httplib::Response& res) {
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Cache-Control", "no-store");
  if (IsConsolePath(req.path)) {
    res.set_header("Content-Security-Policy", kConsoleContentSecurityPolicy);
    res.set_header("X-Frame-Options", "DENY");
    res.set_header("Referrer-Policy", "no-referrer");
  }
}

}  // namespace tf::controller
