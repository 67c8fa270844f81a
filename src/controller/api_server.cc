#include "controller/api_server.h"

#include <httplib.h>
#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "controller/usage_history.h"
#include "controller/web_console.h"

namespace tf::controller {
namespace {

using nlohmann::json;

constexpr size_t kApiWorkerThreads = 64;
constexpr size_t kMaxBodyBytes = 1 << 20;  // the largest request (a node with many GPUs) is a few KiB

// When the request this server thread works on was read (headers parsed).
thread_local std::chrono::steady_clock::time_point t_request_start;
// Who the current request speaks for (set by the pre-routing handler before any /v1/ handler).
thread_local ApiToken t_who;

bool IsAdmin() { return t_who.role == Role::kAdmin; }

// What a tenant or node token may reach at all; handlers then narrow it to what that tenant or
// node owns. An admin may do everything.
Status Authorize(const ApiToken& who, const std::string& method, const std::string& path) {
  if (who.role == Role::kAdmin) return Status::Ok();
  // Compiled once: every call of a tenant or node token goes through here.
  static const std::regex kPool(R"(/v1/pools(/[^/]+)?)"), kNode(R"(/v1/nodes(/[^/]+)?)"),
      kAllocations(R"(/v1/allocations(/[^/]+)?)"), kEvictions(R"(/v1/evictions(/[^/]+)?)"),
      kOneAllocation(R"(/v1/allocations/[^/]+)"), kAllocationAction(R"(/v1/allocations/[^/]+/(freeze|thaw|renew))"),
      kEvictionStopped(R"(/v1/evictions/[^/]+/stopped)");
  auto matches = [&](const std::regex& pattern) { return std::regex_match(path, pattern); };
  const bool read = method == "GET";
  if (read && (matches(kPool) || path == "/v1/gpus" || matches(kNode) || path == "/v1/usage" ||
               path == "/v1/history" || matches(kAllocations) || matches(kEvictions))) {
    return Status::Ok();
  }
  if (who.role == Role::kTenant) {
    if (read && (path == "/v1/quotas" || path == "/v1/quotas/" + who.tenant)) return Status::Ok();
    if (method == "POST" && path == "/v1/allocations") return Status::Ok();
    if (method == "DELETE" && matches(kOneAllocation)) return Status::Ok();
    if (method == "PATCH" && matches(kOneAllocation)) return Status::Ok();  // tier idle overrides
    if (method == "POST" && matches(kAllocationAction)) return Status::Ok();
    return PermissionDenied("a tenant token (tenant '" + who.tenant + "') may not " + method + " " + path +
                            ": it manages its own allocations only; ask an admin");
  }
  if (method == "POST" && (path == "/v1/nodes" || matches(kEvictionStopped))) return Status::Ok();
  if (method == "POST" && path == "/v1/nodes/" + who.node + "/heartbeat") return Status::Ok();
  return PermissionDenied("a node token (node '" + who.node + "') may not " + method + " " + path);
}

// Handlers: the tenant or node the caller is confined to ("" for an admin).
std::string OwnTenant() { return t_who.role == Role::kTenant ? t_who.tenant : ""; }
std::string OwnNode() { return t_who.role == Role::kNode ? t_who.node : ""; }
bool MaySee(const Allocation& a) {
  return IsAdmin() || (t_who.role == Role::kTenant && a.tenant == t_who.tenant) ||
         (t_who.role == Role::kNode && a.node == t_who.node);
}

// The allocation `id` if the caller may see it; another tenant's or node's looks absent.
StatusOr<Allocation> VisibleAllocation(const Controller* c, const std::string& id) {
  StatusOr<Allocation> a = c->GetAllocation(id);
  if (a.ok() && !MaySee(*a)) return NotFound("allocation '" + id + "' not found");
  return a;
}

void Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void ReplyError(httplib::Response& res, const Status& s) {
  Reply(res, HttpStatusFor(s),
        {{"error", {{"code", std::string(StatusCodeName(s.code()))}, {"message", s.message()}}}});
}

// Typed access to an optional field of a JSON request object, with a clear message.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}
  Status status() const { return status_; }

  std::string Str(const char* name, bool required = false) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) {
      if (required) Fail(std::string("field '") + name + "' is required");
      return {};
    }
    if (!it->is_string()) {
      Fail(std::string("field '") + name + "' must be a string");
      return {};
    }
    return it->get<std::string>();
  }
  double Num(const char* name, bool required = false) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) {
      if (required) Fail(std::string("field '") + name + "' is required");
      return 0;
    }
    if (!it->is_number()) {
      Fail(std::string("field '") + name + "' must be a number");
      return 0;
    }
    return it->get<double>();
  }
  // A TFLOPS field as the controller holds it: milli-TFLOPS, rounded to the nearest (ToMilliTflops).
  // Refused beyond +-1e12 TFLOPS before any conversion; the controller checks the tighter limits.
  MilliTflops Tflops(const char* name, bool required = false) {
    const double v = Num(name, required);
    if (!(std::fabs(v) <= 1e12)) {
      Fail(std::string("field '") + name + "' must be a number of TFLOPS of at most 1e12");
      return 0;
    }
    return ToMilliTflops(v);
  }
  int64_t Int(const char* name, bool required = false) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) {
      if (required) Fail(std::string("field '") + name + "' is required");
      return 0;
    }
    if (!it->is_number_integer() ||
        (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      Fail(std::string("field '") + name + "' must be an integer (64-bit signed)");
      return 0;
    }
    return it->get<int64_t>();
  }
  // An integer in [lo, hi], checked before any narrowing.
  int64_t IntIn(const char* name, int64_t lo, int64_t hi, bool required = false) {
    const bool present = j_.contains(name) && !j_.at(name).is_null();
    int64_t v = Int(name, required);
    if (present && status_.ok() && (v < lo || v > hi)) {
      Fail(std::string("field '") + name + "' must be an integer from " + std::to_string(lo) + " to " +
           std::to_string(hi));
      return 0;
    }
    return v;
  }
  const json* Array(const char* name) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return nullptr;
    if (!it->is_array()) {
      Fail(std::string("field '") + name + "' must be an array");
      return nullptr;
    }
    return &*it;
  }

 private:
  void Fail(std::string m) {
    if (status_.ok()) status_ = InvalidArgument(std::move(m));
  }
  const json& j_;
  Status status_;
};

StatusOr<json> ParseBody(const httplib::Request& req) {
  if (req.body.empty()) return InvalidArgument("request body must be a JSON object");
  json j = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("request body is not valid JSON");
  if (!j.is_object()) return InvalidArgument("request body must be a JSON object");
  return j;
}

// The tier idle overrides of a request body (idle_swap_ms, idle_disk_ms, idle_zero_ms; absent:
// unset), each refused with a message naming it unless an integer of 0 (never) to 30 days in ms.
// With `null_clears` (PATCH), null sets the field to "back to the QoS default" (an empty value).
Status ReadTierIdle(const json& body, bool null_clears, std::optional<std::optional<int64_t>>* swap,
                    std::optional<std::optional<int64_t>>* disk, std::optional<std::optional<int64_t>>* zero) {
  Fields f(body);
  for (auto [name, out] :
       {std::pair{"idle_swap_ms", swap}, std::pair{"idle_disk_ms", disk}, std::pair{"idle_zero_ms", zero}}) {
    auto it = body.find(name);
    if (it == body.end() || (it->is_null() && !null_clears)) continue;
    if (it->is_null()) {
      *out = std::optional<int64_t>{};
      continue;
    }
    const int64_t ms = f.Int(name);
    TF_RETURN_IF_ERROR(f.status());
    TF_RETURN_IF_ERROR(ValidateTierIdle(name, ms));
    *out = ms;
  }
  return Status::Ok();
}

// A pool from a request body; `name` (from the path) wins over the body's.
// Refuses a body field that request `request` does not take: ignored, a typo would pass for a
// field left out (a quota PUT with "max_vram_gib" cleared every limit of the tenant).
Status OnlyKnownFields(const json& body, const std::vector<std::string_view>& known, const char* request) {
  for (const auto& [key, value] : body.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string list;
    for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    return InvalidArgument("field '" + key + "' is not known here (" + request + " takes " + list + ")");
  }
  return Status::Ok();
}

const std::vector<std::string_view>& PoolFields() {
  static const std::vector<std::string_view> fields = {
      "name", "placement_mode", "tflops_oversell_ratio", "vram_expand_to_host_percent", "vram_expand_to_disk_percent"};
  return fields;
}

StatusOr<Pool> PoolSpec(const json& body, const std::string& name) {
  TF_RETURN_IF_ERROR(OnlyKnownFields(body, PoolFields(), "a pool"));
  Fields f(body);
  Pool p;
  p.name = name.empty() ? f.Str("name", true) : name;
  p.placement_mode = f.Str("placement_mode");
  if (body.contains("tflops_oversell_ratio")) p.tflops_oversell_ratio = f.Num("tflops_oversell_ratio");
  if (body.contains("vram_expand_to_host_percent")) p.vram_expand_to_host_percent = static_cast<int>(f.IntIn("vram_expand_to_host_percent", 0, 400));
  if (body.contains("vram_expand_to_disk_percent")) p.vram_expand_to_disk_percent = static_cast<int>(f.IntIn("vram_expand_to_disk_percent", 0, 400));
  if (!f.status().ok()) return f.status();
  return p;
}

json NodeJson(const NodeStatus& n) {
  json j = ToJson(n.node);
  j.erase("credential_sha256");  // stored, never shown
  j["last_heartbeat_ms"] = n.last_heartbeat_ms;
  j["allocations"] = n.allocations;
  return j;
}

json GpuJson(const GpuStatus& g) {
  json j = ToJson(g.gpu);
  j["utilization_percent"] = g.utilization_percent;
  j["memory_used_mib"] = g.memory_used_mib;
  j["sampled_ms"] = g.sampled_ms;
  j["schedulable_vram_mib"] = g.schedulable_vram_mib;
  return j;
}

template <typename T, typename F>
json Array(const std::vector<T>& items, F to_json) {
  json a = json::array();
  for (const T& i : items) a.push_back(to_json(i));
  return a;
}

// A list answer, paged: `?limit=N` (1..10000; absent: everything) and `?after=KEY` (exclusive)
// over the items sorted by `key`; "next" holds the key to pass as `after` while more remain. Only
// the page is turned into JSON.
template <typename T, typename K, typename F>
void ReplyList(const httplib::Request& req, httplib::Response& res, const char* field, std::vector<T> items, K key,
               F to_json) {
  size_t limit = items.size();
  if (req.has_param("limit")) {
    const std::string text = req.get_param_value("limit");
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || n < 1 || n > 10000)
      return ReplyError(res, InvalidArgument("limit must be an integer from 1 to 10000, got '" + text + "'"));
    limit = static_cast<size_t>(n);
  }
  std::sort(items.begin(), items.end(), [&](const T& x, const T& y) { return key(x) < key(y); });
  const std::string after = req.get_param_value("after");
  auto from = after.empty() ? items.begin()
                            : std::upper_bound(items.begin(), items.end(), after,
                                               [&](const std::string& k, const T& x) { return k < key(x); });
  json page = json::array();
  json out;
  for (auto it = from; it != items.end(); ++it) {
    if (page.size() == limit) {
      out["next"] = key(*std::prev(it));
      break;
    }
    page.push_back(to_json(*it));
  }
  out[field] = std::move(page);
  Reply(res, 200, out);
}

}  // namespace

bool TokenEquals(const std::string& expected, const std::string& presented) {
  // Compare every byte of the presented token against the expected one (cycled), so the time
  // taken reveals neither a matching prefix nor the expected length.
  if (expected.empty()) return false;
  unsigned char diff = expected.size() == presented.size() ? 0 : 1;
  for (size_t i = 0; i < presented.size(); ++i)
    diff |= static_cast<unsigned char>(presented[i] ^ expected[i % expected.size()]);
  return diff == 0 && !presented.empty();
}

namespace {

// The HTTPS server's context: the certificate chain and key of `tls`, TLS 1.2 or later. False
// (the server is then not valid) when a file does not load.
std::unique_ptr<httplib::Server> MakeTlsServer(const ServerTlsFiles& tls) {
  return std::make_unique<httplib::SSLServer>([tls](SSL_CTX& ctx) {
    SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION);
    return SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION) == 1 &&
           SSL_CTX_use_certificate_chain_file(&ctx, tls.cert_file.c_str()) == 1 &&
           SSL_CTX_use_PrivateKey_file(&ctx, tls.key_file.c_str(), SSL_FILETYPE_PEM) == 1 &&
           SSL_CTX_check_private_key(&ctx) == 1;
  });
}

}  // namespace

ApiServer::ApiServer(Controller* controller, std::string token, ServerTlsFiles tls)
    : controller_(controller), token_(std::move(token)), tls_(std::move(tls)),
      server_(tls_.enabled() ? MakeTlsServer(tls_) : std::make_unique<httplib::Server>()) {
  Routes();
}

ApiServer::~ApiServer() { Stop(); }

void ExclusiveListenSocket(int sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // restart through TIME_WAIT only
}

StatusOr<int> ApiServer::Bind(const std::string& host, int port) {
  if (!server_->is_valid()) {
    return InvalidArgument("cannot load the TLS certificate " + tls_.cert_file + " and key " + tls_.key_file);
  }
  if (port == 0) {
    int p = server_->bind_to_any_port(host);
    if (p <= 0) return Unavailable("cannot bind " + host + " on any port");
    return p;
  }
  if (!server_->bind_to_port(host, port)) {
    return Unavailable("cannot listen on " + host + ":" + std::to_string(port) +
                       ": the port is in use (another tfusion controller or agent?) or the address is not this machine's");
  }
  return port;
}

void ApiServer::Start() {
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // The socket is already bound and listening: connections queue until the loop accepts them.
}

void ApiServer::Stop() {
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
}

void ApiServer::Routes() {
  httplib::Server& s = *server_;
  auto Record = [this](const char* method, const char* pattern) { routes_.emplace_back(method, std::regex(pattern)); };
  // Ours alone: no SO_REUSEPORT (the library's default), so a second controller on a port in use
  // fails to bind instead of splitting the connections with the first.
  s.set_socket_options(ExclusiveListenSocket);
  s.set_payload_max_length(kMaxBodyBytes);
  // cpp-httplib serves each keep-alive connection on one pool thread until it goes idle for the
  // keep-alive timeout; its default pool (8 threads here) left the 9th concurrent client waiting
  // seconds. 64 connections are served at once; the threads mostly sleep in read().
  s.new_task_queue = [] { return new httplib::ThreadPool(kApiWorkerThreads); };
  s.set_keep_alive_max_count(100000);
  s.set_tcp_nodelay(true);  // small JSON replies: no Nagle/delayed-ACK stalls (40 ms)
  s.set_post_routing_handler(AddSecurityHeaders);
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    t_request_start = std::chrono::steady_clock::now();
    if (req.path == "/healthz" || IsConsolePath(req.path)) return httplib::Server::HandlerResponse::Unhandled;
    std::string auth = req.get_header_value("Authorization");
    // The scheme is case-insensitive (RFC 7235): "bearer " as "Bearer ".
    const bool bearer = auth.size() > 7 && strncasecmp(auth.c_str(), "Bearer ", 7) == 0;
    const std::string presented = bearer ? auth.substr(7) : "";
    bool ok = !presented.empty() && TokenEquals(token_, presented);
    t_who = ApiToken{"bootstrap", Role::kAdmin, "", "", "", "", 0};
    if (!ok && !presented.empty()) {
      if (StatusOr<ApiToken> t = controller_->Authenticate(presented); t.ok()) {
        t_who = *t;
        ok = true;
      }
    }
    if (ok) {
      // /metrics names every tenant's allocations: an admin's or a node's to read (a scraper's
      // token), not a tenant's, which the API shows only its own.
      Status allowed = req.path != "/metrics" ? Authorize(t_who, req.method, req.path)
                       : t_who.role == Role::kTenant
                           ? PermissionDenied("a tenant token (tenant '" + t_who.tenant +
                                              "') may not read /metrics: it names every tenant's allocations; "
                                              "scrape with an admin or node token")
                           : Status::Ok();
      if (!allowed.ok()) {
        res.set_header("Connection", "close");
        ReplyError(res, allowed);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // A standby knows only the bootstrap token (the others are loaded when it leads): whoever
    // presents another is sent on to the leader like any caller (nothing is served to it), not
    // refused as a stranger, so that an agent or client with a token made by `token create`
    // moves on to the next replica.
    if ((ok || !presented.empty()) && req.path.rfind("/v1/", 0) == 0 && !controller_->Serving()) {
      // A standby (or a replica that lost its store) answers nothing from its state, reads
      // included: an agent reading "no allocations" from it would stop its tenants. The leader is
      // named to a verified token only.
      const std::string leader = ok && leader_lookup_ ? leader_lookup_() : "";
      if (!leader.empty()) res.set_header("X-TF-Leader", leader);
      res.set_header("Connection", "close");
      ReplyError(res, Unavailable("this controller replica is not the leader" +
                                  (!ok ? std::string(": send requests to another replica")
                                   : leader.empty() ? std::string(" (no leader is known right now; retry)")
                                                    : ": send requests to the leader, " + leader)));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (ok) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    // The request body has not been read at this point: close the connection rather than let
    // the unread body be parsed as the next request.
    res.set_header("Connection", "close");
    ReplyError(res, Unauthenticated("missing or wrong bearer token"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Called once the answer is written.
  s.set_logger([this](const httplib::Request& req, const httplib::Response&) {
    if (req.path.rfind("/v1/", 0) != 0) return;
    request_times_.Record(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_request_start).count());
  });
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 413) {
      res.set_header("Connection", "close");
      // The HTTP library holds form bodies (curl -d's default type) to 8 KiB, below our limit.
      const bool form = req.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0;
      const std::string why = form ? "a request body sent as a form (Content-Type: application/x-www-form-urlencoded, "
                                     "curl -d's default) is limited to 8192 bytes: send it with Content-Type: "
                                     "application/json (up to " + std::to_string(kMaxBodyBytes) + " bytes)"
                                   : "request body is larger than " + std::to_string(kMaxBodyBytes) + " bytes";
      Reply(res, 413, {{"error", {{"code", "payload_too_large"}, {"message", why}}}});
      return;
    }
    if (res.status == 400 && res.body.empty()) {
      // The HTTP library refused the request before any route saw it: most often a POST or PUT
      // whose body has neither a Content-Length nor chunked encoding (as `curl -X POST` sends);
      // else a malformed request line or header, or a body it could not read.
      res.set_header("Connection", "close");
      const bool unsized = (req.method == "POST" || req.method == "PUT" || req.method == "PATCH") &&
                           !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding");
      return ReplyError(res, InvalidArgument(unsized ? "the HTTP request could not be read: a POST, PUT or PATCH needs a "
                                                       "Content-Length header (send {} when there is nothing to send)"
                                                     : "the HTTP request could not be read (a malformed request line "
                                                       "or header, or a body that could not be read)"));
    }
    if (res.status != 404 || !res.body.empty()) return;
    std::string allowed;  // the methods this path has, when it has any
    for (const auto& [method, pattern] : routes_) {
      if (!std::regex_match(req.path, pattern) || allowed.find(method) != std::string::npos) continue;
      allowed += (allowed.empty() ? "" : ", ") + method;
    }
    if (allowed.empty()) return ReplyError(res, NotFound("no route " + req.method + " " + req.path));
    res.set_header("Allow", allowed);
    Reply(res, 405, {{"error", {{"code", "method_not_allowed"},
                                {"message", req.method + " " + req.path + " is not allowed; allowed: " + allowed}}}});
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unexpected error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    ReplyError(res, Internal(what));
  });
  Controller* c = controller_;

  Record("GET", "/healthz");
  s.Get("/healthz", [c](const httplib::Request&, httplib::Response& res) {
    Reply(res, 200, {{"ok", true}, {"serving", c->Serving()}});
  });
  Record("GET", "/");
  Record("GET", "/console");
  Record("GET", R"(/console/.*)");
  RegisterConsoleRoutes(s);
  Record("GET", "/metrics");
  s.Get("/metrics", [this, c](const httplib::Request&, httplib::Response& res) {
    prom::Exposition e;
    c->WriteMetrics(&e);
    e.Family("tf_controller_api_request_seconds", prom::Type::kHistogram,
             "/v1/ requests, from their headers read to their answer written.");
    request_times_.WriteTo(&e, "tf_controller_api_request_seconds", {});
    res.set_content(e.Take(), "text/plain; version=0.0.4");
  });

  // Pools.
  Record("GET", "/v1/pools");
  s.Get("/v1/pools", [c](const httplib::Request& req, httplib::Response& res) {
    ReplyList(req, res, "pools", c->ListPools(), [](const Pool& p) -> const std::string& { return p.name; },
              [](const Pool& p) { return ToJson(p); });
  });
  Record("POST", "/v1/pools");
  s.Post("/v1/pools", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    StatusOr<Pool> spec = PoolSpec(*body, "");
    if (!spec.ok()) return ReplyError(res, spec.status());
    StatusOr<Pool> p = c->CreatePool(*spec);
    if (!p.ok()) return ReplyError(res, p.status());
    Reply(res, 201, ToJson(*p));
  });
  Record("PUT", R"(/v1/pools/([^/]+))");
  s.Put(R"(/v1/pools/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    StatusOr<Pool> spec = PoolSpec(*body, req.matches[1]);
    if (!spec.ok()) return ReplyError(res, spec.status());
    StatusOr<Pool> p = c->UpdatePool(*spec);
    if (!p.ok()) return ReplyError(res, p.status());
    Reply(res, 200, ToJson(*p));
  });

  // PATCH changes only the fields given; PUT (above) replaces the pool's settings (absent fields
  // get their defaults).
  Record("PATCH", R"(/v1/pools/([^/]+))");
  s.Patch(R"(/v1/pools/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    if (Status st = OnlyKnownFields(*body, PoolFields(), "a pool"); !st.ok()) return ReplyError(res, st);
    if (body->contains("name")) return ReplyError(res, InvalidArgument("a pool's name cannot be changed"));
    Fields f(*body);
    std::optional<std::string> mode;
    std::optional<double> ratio;
    if (body->contains("placement_mode")) mode = f.Str("placement_mode");
    if (body->contains("tflops_oversell_ratio")) ratio = f.Num("tflops_oversell_ratio");
    std::optional<int> host, disk;
    if (body->contains("vram_expand_to_host_percent")) host = static_cast<int>(f.IntIn("vram_expand_to_host_percent", 0, 400));
    if (body->contains("vram_expand_to_disk_percent")) disk = static_cast<int>(f.IntIn("vram_expand_to_disk_percent", 0, 400));
    if (!f.status().ok()) return ReplyError(res, f.status());
    StatusOr<Pool> p = c->PatchPool(req.matches[1], mode, host, disk, ratio);
    if (!p.ok()) return ReplyError(res, p.status());
    Reply(res, 200, ToJson(*p));
  });

  // Tenant quotas.
  Record("GET", "/v1/quotas");
  s.Get("/v1/quotas", [c](const httplib::Request& req, httplib::Response& res) {
    std::vector<TenantQuota> list = c->ListTenantQuotas();
    if (!OwnTenant().empty()) std::erase_if(list, [](const TenantQuota& q) { return q.tenant != OwnTenant(); });
    ReplyList(req, res, "quotas", list, [](const TenantQuota& q) -> const std::string& { return q.tenant; },
              [](const TenantQuota& q) { return ToJson(q); });
  });
  Record("GET", R"(/v1/quotas/([^/]+))");
  s.Get(R"(/v1/quotas/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    const std::string tenant = req.matches[1];
    for (const TenantQuota& q : c->ListTenantQuotas())
      if (q.tenant == tenant) return Reply(res, 200, ToJson(q));
    ReplyError(res, NotFound("tenant '" + tenant + "' has no quota: nothing limits it"));
  });
  Record("PUT", R"(/v1/quotas/([^/]+))");
  s.Put(R"(/v1/quotas/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    if (Status st = OnlyKnownFields(*body, {"max_tflops", "max_vram_mib", "max_gpus", "max_qos"}, "a quota"); !st.ok())
      return ReplyError(res, st);
    Fields f(*body);
    TenantQuota q{req.matches[1], f.Tflops("max_tflops"), f.Int("max_vram_mib"),
                  static_cast<int>(f.IntIn("max_gpus", 0, 1'000'000)), f.Str("max_qos")};
    // Left out, the QoS cap stays (a client that knows only the three limits must not lift it);
    // "" lifts it.
    if (!body->contains("max_qos")) {
      for (const TenantQuota& old : c->ListTenantQuotas())
        if (old.tenant == q.tenant) q.max_qos = old.max_qos;
    }
    if (!f.status().ok()) return ReplyError(res, f.status());
    StatusOr<TenantQuota> out = c->SetTenantQuota(q);
    if (!out.ok()) return ReplyError(res, out.status());
    Reply(res, 200, ToJson(*out));
  });
  Record("DELETE", R"(/v1/quotas/([^/]+))");
  s.Delete(R"(/v1/quotas/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    Status st = c->DeleteTenantQuota(req.matches[1]);
    if (!st.ok()) return ReplyError(res, st);
    Reply(res, 200, {{"deleted", std::string(req.matches[1])}});
  });
  Record("GET", R"(/v1/pools/([^/]+))");
  s.Get(R"(/v1/pools/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<Pool> p = c->GetPool(req.matches[1]);
    if (!p.ok()) return ReplyError(res, p.status());
    Reply(res, 200, ToJson(*p));
  });
  Record("DELETE", R"(/v1/pools/([^/]+))");
  s.Delete(R"(/v1/pools/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    Status st = c->DeletePool(req.matches[1]);
    if (!st.ok()) return ReplyError(res, st);
    Reply(res, 200, {{"deleted", std::string(req.matches[1])}});
  });

  // Nodes and GPUs.
  Record("GET", "/v1/nodes");
  s.Get("/v1/nodes", [c](const httplib::Request& req, httplib::Response& res) {
    ReplyList(req, res, "nodes", c->ListNodes(), [](const NodeStatus& n) -> const std::string& { return n.node.name; }, NodeJson);
  });
  Record("POST", "/v1/nodes");
  s.Post("/v1/nodes", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    Fields f(*body);
    NodeRegistration reg{f.Str("name", true), f.Str("pool"), f.Str("address"), {}, f.Str("worker_address"),
                         f.Str("credential")};
    if (const json* gpus = f.Array("gpus")) {
      for (const json& g : *gpus) {
        if (!g.is_object()) return ReplyError(res, InvalidArgument("each entry of 'gpus' must be an object"));
        Fields gf(g);
        GpuReport r{gf.Str("uuid", true), gf.Str("model"), static_cast<int>(gf.Int("index")),
                    g.contains("numa_node") ? static_cast<int>(gf.Int("numa_node")) : -1,
                    gf.Num("tflops", true), gf.Int("vram_mib", true)};
        if (g.contains("host_tier_budget_mib")) r.host_tier_budget_mib = gf.Int("host_tier_budget_mib");
        if (!gf.status().ok()) return ReplyError(res, InvalidArgument("gpus: " + gf.status().message()));
        reg.gpus.push_back(std::move(r));
      }
    }
    if (body->contains("disk_tier_budget_mib")) reg.disk_tier_budget_mib = f.Int("disk_tier_budget_mib");
    if (!f.status().ok()) return ReplyError(res, f.status());
    if (!OwnNode().empty() && reg.name != OwnNode())
      return ReplyError(res, PermissionDenied("this token registers node '" + OwnNode() + "' only"));
    StatusOr<Node> n = c->RegisterNode(reg);
    if (!n.ok()) return ReplyError(res, n.status());
    Reply(res, 200, NodeJson({*n, 0}));
  });
  Record("DELETE", R"(/v1/nodes/([^/]+))");
  s.Delete(R"(/v1/nodes/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    Status st = c->DeregisterNode(req.matches[1]);
    if (!st.ok()) return ReplyError(res, st);
    Reply(res, 200, {{"deleted", std::string(req.matches[1])}});
  });
  Record("GET", R"(/v1/nodes/([^/]+))");
  s.Get(R"(/v1/nodes/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<NodeStatus> n = c->GetNode(req.matches[1]);
    if (!n.ok()) return ReplyError(res, n.status());
    Reply(res, 200, NodeJson(*n));
  });
  // Cordon (admin): the node keeps its allocations and takes no new ones until uncordoned
  // (docs/operations.md, "Maintenance: cordon and drain"). Tenant and node tokens: 403 (Authorize).
  for (const char* action : {"cordon", "uncordon"}) {
    const std::string pattern = std::string(R"(/v1/nodes/([^/]+)/)") + action;
    routes_.emplace_back("POST", std::regex(pattern));
    const bool cordon = std::string(action) == "cordon";
    s.Post(pattern, [c, cordon](const httplib::Request& req, httplib::Response& res) {
      if (!req.body.empty()) {
        StatusOr<json> body = ParseBody(req);
        if (!body.ok()) return ReplyError(res, body.status());
        for (const auto& [key, value] : body->items())
          return ReplyError(res, InvalidArgument("field '" + key + "' is not known here (" +
                                                 (cordon ? "a cordon" : "an uncordon") + " takes no fields)"));
      }
      StatusOr<Node> n = c->SetNodeCordoned(req.matches[1], cordon);
      if (!n.ok()) return ReplyError(res, n.status());
      StatusOr<NodeStatus> now = c->GetNode(n->name);
      if (!now.ok()) return ReplyError(res, now.status());
      Reply(res, 200, NodeJson(*now));
    });
  }
  Record("POST", R"(/v1/nodes/([^/]+)/heartbeat)");
  s.Post(R"(/v1/nodes/([^/]+)/heartbeat)", [c](const httplib::Request& req, httplib::Response& res) {
    std::vector<GpuSample> samples;
    std::vector<VgpuUseSample> vgpus;
    std::string credential;
    int64_t disk_tier_budget_mib = -1;
    if (!req.body.empty()) {
      StatusOr<json> body = ParseBody(req);
      if (!body.ok()) return ReplyError(res, body.status());
      Fields f(*body);
      credential = f.Str("credential");
      if (body->contains("disk_tier_budget_mib")) disk_tier_budget_mib = f.Int("disk_tier_budget_mib");
      if (const json* gpus = f.Array("gpus")) {
        for (const json& g : *gpus) {
          if (!g.is_object()) return ReplyError(res, InvalidArgument("each entry of 'gpus' must be an object"));
          Fields gf(g);
          GpuSample smp{gf.Str("uuid", true), gf.Num("utilization_percent"), gf.Int("memory_used_mib")};
          if (g.contains("host_tier_budget_mib")) smp.host_tier_budget_mib = gf.Int("host_tier_budget_mib");
          if (g.contains("unpooled_share_ppm")) smp.unpooled_share_ppm = gf.Int("unpooled_share_ppm");
          if (g.contains("unpooled_vram_mib")) smp.unpooled_vram_mib = gf.Int("unpooled_vram_mib");
          if (!gf.status().ok()) return ReplyError(res, InvalidArgument("gpus: " + gf.status().message()));
          samples.push_back(std::move(smp));
        }
      }
      if (const json* vs = f.Array("vgpus")) {
        for (const json& v : *vs) {
          if (!v.is_object()) return ReplyError(res, InvalidArgument("each entry of 'vgpus' must be an object"));
          Fields vf(v);
          VgpuUseSample u{vf.Str("allocation", true), vf.Str("gpu", true), vf.Int("busy_ns_total", true),
                          vf.Int("throttled_ns_total", true), vf.Str("tier_state"), vf.Int("swapped_bytes")};
          static const std::set<std::string> kTierStates{"", "off", "resident", "swapping out", "swapped",
                                                          "swapping in", "on disk", "checkpointed", "mixed"};
          if (!kTierStates.count(u.tier_state) || u.swapped_bytes < 0)
            return ReplyError(res, InvalidArgument("vgpus: tier_state must be one of off, resident, swapping out, "
                                                   "swapped, swapping in, on disk, checkpointed, mixed; swapped_bytes >= 0"));
          for (auto [name, out] : {std::pair{"applied_idle_swap_ms", &u.applied_idle_swap_ms},
                                   std::pair{"applied_idle_disk_ms", &u.applied_idle_disk_ms},
                                   std::pair{"applied_idle_zero_ms", &u.applied_idle_zero_ms}}) {
            if (!v.contains(name)) continue;
            *out = vf.Int(name);
            if (vf.status().ok() && !ValidateTierIdle(name, *out).ok())
              return ReplyError(res, InvalidArgument(std::string("vgpus: ") + ValidateTierIdle(name, *out).message()));
          }
          if (!vf.status().ok()) return ReplyError(res, InvalidArgument("vgpus: " + vf.status().message()));
          if (u.busy_ns_total < 0 || u.throttled_ns_total < 0)
            return ReplyError(res, InvalidArgument("vgpus: busy_ns_total and throttled_ns_total must be >= 0"));
          if (v.contains("held_turn_ns_total") && !v.at("held_turn_ns_total").is_null()) {  // null: not reported
            u.held_turn_ns_total = vf.Int("held_turn_ns_total");
            if (!vf.status().ok()) return ReplyError(res, InvalidArgument("vgpus: " + vf.status().message()));
            if (u.held_turn_ns_total < 0 || u.held_turn_ns_total > u.throttled_ns_total)
              return ReplyError(res, InvalidArgument("vgpus: held_turn_ns_total must be 0..throttled_ns_total"));
          }
          if (const json* ps = vf.Array("processes")) {
            if (ps->size() > kMaxReportedProcesses)
              return ReplyError(res, InvalidArgument("vgpus: at most " + std::to_string(kMaxReportedProcesses) +
                                                     " processes per vGPU"));
            for (const json& p : *ps) {
              if (!p.is_object()) return ReplyError(res, InvalidArgument("vgpus: each process must be an object"));
              Fields pf(p);
              VgpuProcess vp{pf.IntIn("pid", 1, 4194304, true), pf.IntIn("vram_bytes", 0, int64_t{1} << 50)};
              if (!pf.status().ok()) return ReplyError(res, InvalidArgument("vgpus: processes: " + pf.status().message()));
              u.processes.push_back(vp);
            }
          }
          if (!vf.status().ok()) return ReplyError(res, InvalidArgument("vgpus: " + vf.status().message()));
          vgpus.push_back(std::move(u));
        }
      }
      if (!f.status().ok()) return ReplyError(res, f.status());
    }
    Status st = c->Heartbeat(req.matches[1], samples, vgpus, credential, disk_tier_budget_mib);
    if (!st.ok()) return ReplyError(res, st);
    Reply(res, 200, {{"ok", true}});
  });
  Record("GET", "/v1/gpus");
  s.Get("/v1/gpus", [c](const httplib::Request& req, httplib::Response& res) {
    ReplyList(req, res, "gpus", c->ListGpus(req.get_param_value("pool")), [](const GpuStatus& g) -> const std::string& { return g.gpu.uuid; },
              GpuJson);
  });

  // What the console shows: pools and GPUs with allocated, schedulable (virtual) and used
  // capacity now, and sampled over the last hour (usage_history.h).
  Record("GET", "/v1/usage");
  s.Get("/v1/usage", [c](const httplib::Request&, httplib::Response& res) {
    UsageSnapshot u = TakeUsageSnapshot(*c, 0);
    Reply(res, 200, {{"pools", Array(u.pools, [](const PoolUsage& p) { return ToJson(p); })},
                     {"gpus", Array(u.gpus, [](const GpuUsage& g) { return ToJson(g); })}});
  });
  Record("GET", "/v1/history");
  s.Get("/v1/history", [this, c](const httplib::Request& req, httplib::Response& res) {
    if (history_ == nullptr) return ReplyError(res, NotFound("this controller keeps no usage history"));
    int64_t since = 0;
    if (req.has_param("since_ms")) {
      const std::string text = req.get_param_value("since_ms");
      char* end = nullptr;
      errno = 0;
      since = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno != 0 || since < 0)
        return ReplyError(res, InvalidArgument("since_ms must be a non-negative integer (ms), got '" + text + "'"));
    }
    const std::string pool = req.get_param_value("pool");
    if (req.has_param("pool")) {
      if (StatusOr<Pool> p = c->GetPool(pool); !p.ok()) return ReplyError(res, p.status());
    }
    Reply(res, 200, history_->ToJson(since, pool));
  });

  // Workloads.
  Record("GET", "/v1/workloads");
  s.Get("/v1/workloads", [c](const httplib::Request& req, httplib::Response& res) {
    ReplyList(req, res, "workloads", c->ListWorkloads(), [](const Workload& w) -> const std::string& { return w.name; },
              [](const Workload& w) { return ToJson(w); });
  });
  Record("POST", "/v1/workloads");
  s.Post("/v1/workloads", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    if (Status st = OnlyKnownFields(*body,
                                    {"name", "pool", "tflops", "tflops_limit", "vram_mib", "gpu_count", "qos",
                                     "idle_swap_ms", "idle_disk_ms", "idle_zero_ms",
                                     // What GET answers besides, ignored: its output posts back as is.
                                     "milli_tflops", "milli_tflops_limit"},
                                    "a workload");
        !st.ok())
      return ReplyError(res, st);
    Fields f(*body);
    Workload w{f.Str("name", true), f.Str("pool"), f.Tflops("tflops", true), f.Int("vram_mib", true),
               body->contains("gpu_count") ? static_cast<int>(f.IntIn("gpu_count", 1, 64)) : 1, Qos::kMedium,
               f.Tflops("tflops_limit")};
    if (body->contains("tflops_limit") && !(w.milli_tflops_limit > 0))
      return ReplyError(res, InvalidArgument("tflops_limit must be a positive number"));
    std::string qos = f.Str("qos");
    if (!f.status().ok()) return ReplyError(res, f.status());
    if (!qos.empty()) {
      StatusOr<Qos> q = ParseQos(qos);
      if (!q.ok()) return ReplyError(res, q.status());
      w.qos = *q;
    }
    std::optional<std::optional<int64_t>> idle_swap, idle_disk, idle_zero;
    if (Status st = ReadTierIdle(*body, false, &idle_swap, &idle_disk, &idle_zero); !st.ok()) return ReplyError(res, st);
    if (idle_swap) w.idle_swap_ms = *idle_swap;
    if (idle_disk) w.idle_disk_ms = *idle_disk;
    if (idle_zero) w.idle_zero_ms = *idle_zero;
    StatusOr<Workload> out = c->CreateWorkload(w);
    if (!out.ok()) return ReplyError(res, out.status());
    Reply(res, 201, ToJson(*out));
  });
  Record("GET", R"(/v1/workloads/([^/]+))");
  s.Get(R"(/v1/workloads/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<Workload> w = c->GetWorkload(req.matches[1]);
    if (!w.ok()) return ReplyError(res, w.status());
    Reply(res, 200, ToJson(*w));
  });
  Record("DELETE", R"(/v1/workloads/([^/]+))");
  s.Delete(R"(/v1/workloads/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    Status st = c->DeleteWorkload(req.matches[1]);
    if (!st.ok()) return ReplyError(res, st);
    Reply(res, 200, {{"deleted", std::string(req.matches[1])}});
  });

  // API tokens (admin only: Authorize).
  Record("GET", "/v1/tokens");
  s.Get("/v1/tokens", [c](const httplib::Request& req, httplib::Response& res) {
    ReplyList(req, res, "tokens", c->ListTokens(), [](const ApiToken& t) -> const std::string& { return t.id; },
              [](const ApiToken& t) {
                json j = ToJson(t);
                j.erase("secret_sha256");  // stored, never shown
                return j;
              });
  });
  Record("POST", "/v1/tokens");
  s.Post("/v1/tokens", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    if (Status st = OnlyKnownFields(*body, {"role", "tenant", "node", "description"}, "a token"); !st.ok())
      return ReplyError(res, st);
    Fields f(*body);
    ApiToken spec;
    StatusOr<Role> role = ParseRole(f.Str("role", true));
    spec.tenant = f.Str("tenant");
    spec.node = f.Str("node");
    spec.description = f.Str("description");
    if (!f.status().ok()) return ReplyError(res, f.status());
    if (!role.ok()) return ReplyError(res, role.status());
    spec.role = *role;
    StatusOr<std::pair<ApiToken, std::string>> made = c->CreateToken(spec);
    if (!made.ok()) return ReplyError(res, made.status());
    json j = ToJson(made->first);
    j.erase("secret_sha256");
    j["token"] = made->second;  // shown this once; the controller keeps only its hash
    Reply(res, 201, j);
  });
  Record("DELETE", R"(/v1/tokens/([^/]+))");
  s.Delete(R"(/v1/tokens/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    Status st = c->RevokeToken(req.matches[1]);
    if (!st.ok()) return ReplyError(res, st);
    Reply(res, 200, {{"revoked", std::string(req.matches[1])}});
  });

  // Allocations.
  Record("GET", "/v1/allocations");
  s.Get("/v1/allocations", [c](const httplib::Request& req, httplib::Response& res) {
    std::string node = OwnNode().empty() ? req.get_param_value("node") : OwnNode();
    std::vector<Allocation> list = node.empty() ? c->ListAllocations() : c->ListAllocationsOnNode(node);
    if (!OwnTenant().empty()) std::erase_if(list, [](const Allocation& a) { return !MaySee(a); });
    // Each vGPU with the use its node last reported: use_percent (over the last heartbeat
    // interval; absent until two reports), throttled_seconds and, of it, turn_seconds (waiting for
    // other vGPUs' turns; absent from nodes that do not report it).
    ReplyList(req, res, "allocations", list,
              [](const Allocation& a) -> const std::string& { return a.id; },
              [c](const Allocation& a) {
                json j = ToJson(a);
                for (json& v : j["vgpus"]) {
                  StatusOr<VgpuUse> u = c->GetVgpuUse(a.id, v.value("gpu", ""));
                  if (!u.ok()) continue;
                  if (u->use_percent >= 0) v["use_percent"] = u->use_percent;
                  v["throttled_seconds"] = u->throttled_seconds;
                  if (u->turn_seconds >= 0) v["turn_seconds"] = u->turn_seconds;
                  if (!u->tier_state.empty()) {
                    v["tier_state"] = u->tier_state;
                    v["swapped_mib"] = u->swapped_bytes >> 20;
                  }
                  if (u->applied_idle_swap_ms >= 0) v["applied_idle_swap_ms"] = u->applied_idle_swap_ms;
                  if (u->applied_idle_disk_ms >= 0) v["applied_idle_disk_ms"] = u->applied_idle_disk_ms;
                  if (u->applied_idle_zero_ms >= 0) v["applied_idle_zero_ms"] = u->applied_idle_zero_ms;
                  json procs = json::array();
                  for (const VgpuProcess& p : u->processes)
                    procs.push_back({{"pid", p.pid}, {"vram_mib", p.vram_bytes >> 20}});
                  v["processes"] = std::move(procs);
                }
                return j;
              });
  });
  Record("POST", "/v1/allocations");
  s.Post("/v1/allocations", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    if (Status st = OnlyKnownFields(*body,
                                    {"workload", "pool", "tflops", "percent", "tflops_limit", "percent_limit", "vram_mib",
                                     "gpu_count", "qos", "gpu_model", "tenant", "node", "request_id", "lease_s",
                                     "allow_preemption", "idle_swap_ms", "idle_disk_ms", "idle_zero_ms"},
                                    "an allocation");
        !st.ok())
      return ReplyError(res, st);
    Fields f(*body);
    AllocationRequest a{f.Str("workload"), f.Str("pool"),  f.Num("tflops"), f.Int("vram_mib"),
                        static_cast<int>(f.IntIn("gpu_count", 1, 64)), f.Str("qos"), f.Str("gpu_model"),
                        f.Str("tenant"), f.Num("percent"), true, f.Num("tflops_limit"), f.Num("percent_limit"),
                        f.Str("request_id")};
    if (body->contains("lease_s")) a.lease_ms = f.IntIn("lease_s", 5, 3600) * 1000;
    a.node = f.Str("node");
    if (auto it = body->find("allow_preemption"); it != body->end()) {
      if (!it->is_boolean()) return ReplyError(res, InvalidArgument("field 'allow_preemption' must be a boolean"));
      a.allow_preemption = it->get<bool>();
    }
    if (!f.status().ok()) return ReplyError(res, f.status());
    std::optional<std::optional<int64_t>> idle_swap, idle_disk, idle_zero;
    if (Status st = ReadTierIdle(*body, false, &idle_swap, &idle_disk, &idle_zero); !st.ok()) return ReplyError(res, st);
    if (idle_swap) a.idle_swap_ms = *idle_swap;
    if (idle_disk) a.idle_disk_ms = *idle_disk;
    if (idle_zero) a.idle_zero_ms = *idle_zero;
    if (!OwnTenant().empty()) {
      if (!a.tenant.empty() && a.tenant != OwnTenant())
        return ReplyError(res, PermissionDenied("this token allocates for tenant '" + OwnTenant() + "' only"));
      a.tenant = OwnTenant();  // within its quota namespace, always
    }
    const bool compute = body->contains("tflops") || body->contains("percent");
    if (a.workload.empty() && (!compute || !body->contains("vram_mib")))
      return ReplyError(res, InvalidArgument("give 'tflops' (or 'percent') and 'vram_mib', or a 'workload'"));
    if (body->contains("tflops") && body->contains("percent"))
      return ReplyError(res, InvalidArgument("give either 'tflops' or 'percent', not both"));
    if (body->contains("tflops") && !(a.tflops > 0))
      return ReplyError(res, InvalidArgument("tflops must be a positive number"));
    if (body->contains("percent") && !(a.percent > 0 && a.percent <= 100))
      return ReplyError(res, InvalidArgument("percent must be a number in (0, 100]"));
    if (body->contains("vram_mib") && a.vram_mib <= 0)
      return ReplyError(res, InvalidArgument("vram_mib must be a positive integer"));
    if (body->contains("gpu_count") && a.gpu_count <= 0)
      return ReplyError(res, InvalidArgument("gpu_count must be a positive integer"));
    if (body->contains("tflops_limit") && !(a.tflops_limit > 0))
      return ReplyError(res, InvalidArgument("tflops_limit must be a positive number"));
    if (body->contains("percent_limit") && !(a.percent_limit > 0 && a.percent_limit <= 100))
      return ReplyError(res, InvalidArgument("percent_limit must be a number in (0, 100]"));
    std::vector<Allocation> preempted;
    bool replayed = false;
    StatusOr<Allocation> out = c->Allocate(a, &preempted, &replayed);
    if (!out.ok()) return ReplyError(res, out.status());
    json j = ToJson(*out);
    j["preempted"] = Array(preempted, [](const Allocation& v) { return v.id; });
    json suspended = json::array();  // of those, the ones suspended (swapped out) rather than released
    for (const Allocation& v : preempted)
      if (v.suspended) suspended.push_back(v.id);
    j["preempted_suspended"] = std::move(suspended);
    j["replayed"] = replayed;  // true: a retry answered with the allocation made the first time
    Reply(res, replayed ? 200 : 201, j);
  });
  Record("GET", R"(/v1/allocations/([^/]+))");
  s.Get(R"(/v1/allocations/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<Allocation> a = VisibleAllocation(c, req.matches[1]);
    if (!a.ok()) return ReplyError(res, a.status());
    Reply(res, 200, ToJson(*a));
  });
  // PATCH changes the allocation's tier idle overrides only (null: back to the QoS default); its
  // node's agent applies them at its next sync.
  Record("PATCH", R"(/v1/allocations/([^/]+))");
  s.Patch(R"(/v1/allocations/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    for (const auto& [key, value] : body->items()) {
      if (key != "idle_swap_ms" && key != "idle_disk_ms" && key != "idle_zero_ms")
        return ReplyError(res, InvalidArgument("field '" + key + "' cannot be changed on a live allocation "
                                               "(PATCH takes idle_swap_ms, idle_disk_ms and idle_zero_ms)"));
    }
    TierIdleChange change;
    if (Status st = ReadTierIdle(*body, true, &change.idle_swap_ms, &change.idle_disk_ms, &change.idle_zero_ms); !st.ok())
      return ReplyError(res, st);
    StatusOr<Allocation> a = VisibleAllocation(c, req.matches[1]);
    if (a.ok()) a = c->SetTierIdle(req.matches[1], change);
    if (!a.ok()) return ReplyError(res, a.status());
    Reply(res, 200, ToJson(*a));
  });
  // Lease renewal (tfusion run renews while its command runs).
  Record("POST", R"(/v1/allocations/([^/]+)/renew)");
  s.Post(R"(/v1/allocations/([^/]+)/renew)", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<Allocation> a = VisibleAllocation(c, req.matches[1]);
    if (a.ok()) a = c->RenewLease(req.matches[1]);
    if (!a.ok()) return ReplyError(res, a.status());
    Reply(res, 200, {{"allocation", a->id}, {"lease_expires_ms", a->lease_expires_ms}});
  });
  // VRAM tiering through the API: the node's agent passes the request to the vGPUs' processes.
  for (const char* action : {"freeze", "thaw"}) {
    const std::string pattern = std::string(R"(/v1/allocations/([^/]+)/)") + action;
    routes_.emplace_back("POST", std::regex(pattern));
    const bool freeze = std::string(action) == "freeze";
    s.Post(pattern, [c, freeze](const httplib::Request& req, httplib::Response& res) {
      // A freeze may name its level: "host" (the default: movable VRAM to host memory) or "zero"
      // (then the rest of each process, its context included, is checkpointed by the driver).
      bool zero = false;
      if (!req.body.empty()) {
        StatusOr<json> body = ParseBody(req);
        if (!body.ok()) return ReplyError(res, body.status());
        for (const auto& [key, value] : body->items()) {
          if (key != "level" || !freeze)
            return ReplyError(res, InvalidArgument("field '" + key + "' is not known here" +
                                                   std::string(freeze ? " (a freeze takes 'level')" : " (a thaw takes no fields)")));
          if (!value.is_string() || (value != "host" && value != "zero"))
            return ReplyError(res, InvalidArgument("field 'level' must be \"host\" (swap VRAM to host memory) or "
                                                   "\"zero\" (also checkpoint the processes with the driver)"));
          zero = value == "zero";
        }
      }
      StatusOr<Allocation> a = VisibleAllocation(c, req.matches[1]);
      if (a.ok()) a = c->RequestTier(req.matches[1], freeze, zero);
      if (!a.ok()) return ReplyError(res, a.status());
      Reply(res, 202, {{"allocation", a->id}, {"freeze_requests", a->freeze_requests},
                       {"zero_requests", a->zero_requests}, {"thaw_requests", a->thaw_requests}, {"node", a->node},
                       {"level", freeze ? (zero ? "zero" : "host") : "resident"}});
    });
  }
  Record("DELETE", R"(/v1/allocations/([^/]+))");
  s.Delete(R"(/v1/allocations/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    if (!IsAdmin()) {  // a tenant releases its own allocations only (others look absent)
      StatusOr<Allocation> a = VisibleAllocation(c, req.matches[1]);
      if (!a.ok()) return ReplyError(res, a.status());
    }
    Status st = c->Release(req.matches[1]);
    if (!st.ok()) return ReplyError(res, st);
    Reply(res, 200, {{"released", std::string(req.matches[1])}});
  });

  // Evictions: allocations taken back while their tenant may still run (docs/controller.md).
  Record("GET", "/v1/evictions");
  s.Get("/v1/evictions", [c](const httplib::Request& req, httplib::Response& res) {
    std::vector<Eviction> list = c->ListEvictions(OwnNode().empty() ? req.get_param_value("node") : OwnNode());
    if (!IsAdmin()) std::erase_if(list, [](const Eviction& e) { return !MaySee(e.allocation); });
    ReplyList(req, res, "evictions", list,
              [](const Eviction& e) -> const std::string& { return e.allocation.id; }, [](const Eviction& e) { return ToJson(e); });
  });
  Record("GET", R"(/v1/evictions/([^/]+))");
  s.Get(R"(/v1/evictions/([^/]+))", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<Eviction> e = c->GetEviction(req.matches[1]);
    if (e.ok() && !MaySee(e->allocation)) e = NotFound("eviction '" + std::string(req.matches[1]) + "' not found");
    if (!e.ok()) return ReplyError(res, e.status());
    Reply(res, 200, ToJson(*e));
  });
  Record("POST", R"(/v1/evictions/([^/]+)/stopped)");
  s.Post(R"(/v1/evictions/([^/]+)/stopped)", [c](const httplib::Request& req, httplib::Response& res) {
    StatusOr<json> body = ParseBody(req);
    if (!body.ok()) return ReplyError(res, body.status());
    Fields f(*body);
    int64_t processes = f.Int("processes", true);
    if (!f.status().ok()) return ReplyError(res, f.status());
    if (processes < 0 || processes > 1'000'000)
      return ReplyError(res, InvalidArgument("processes must be an integer in [0, 1000000]"));
    if (!OwnNode().empty()) {  // a node reports only the evictions of its own node
      StatusOr<Eviction> mine = c->GetEviction(req.matches[1]);
      if (mine.ok() && !MaySee(mine->allocation))
        mine = NotFound("eviction '" + std::string(req.matches[1]) + "' not found");
      if (!mine.ok()) return ReplyError(res, mine.status());
    }
    StatusOr<Eviction> e = c->MarkEvictionStopped(req.matches[1], static_cast<int>(processes));
    if (!e.ok()) return ReplyError(res, e.status());
    Reply(res, 200, ToJson(*e));
  });
}

}  // namespace tf::controller
