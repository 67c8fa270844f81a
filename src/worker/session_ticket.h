// Session tickets: what `tfusion run --remote` gives the tenant program instead of the worker's
// token. A ticket opens sessions on the worker until it expires, and nothing else: it cannot be
// turned back into the token or into a longer-lived ticket. Formats:
//   tkt1.<expiry, Unix seconds>.<nonce, 32 hex>.<HMAC-SHA256(worker token, id), 64 hex>
//   tkt2.<expiry>.<nonce>.<limits digest, 32 hex>.<HMAC-SHA256(worker token, id), 64 hex>
// where the id is everything before the last dot. A tkt2 ticket is bound to the vGPU limits it
// was made for (SessionLimitsDigest): a session opened with it whose client asks for other limits,
// or none, is refused, so a tenant cannot shed its limits by opening a session of its own.
// Revoking every ticket at once: change the worker's token.
#pragma once

#include <cstdint>
#include <string>

#include "worker/worker.h"

namespace tf::worker {

// 32 hex digits naming the limits record a client sends (every field, empty ones too).
std::string SessionLimitsDigest(const SessionLimits& l);

// The limits digest a ticket id ("tkt2.<expiry>.<nonce>.<digest>") is bound to; "" for a tkt1 id
// or anything else.
std::string TicketLimitsDigest(const std::string& id);

// The handshake never sends a ticket whole: the client sends its id ("tkt1.<expiry>.<nonce>") and
// proves it knows the mac (transport/handshake.h, SplitCredential).
//
// A ticket valid until expires_unix_s, keyed with the worker's token. Empty when the token is
// empty (a worker without a token accepts anyone) or no randomness is available.
// With a limits digest (SessionLimitsDigest), a tkt2 ticket bound to those limits.
std::string MintSessionTicket(const std::string& worker_token, int64_t expires_unix_s,
                              const std::string& limits_digest = "");

// True when `presented` is a well-formed ticket made with worker_token that has not expired at
// now_unix_s. The MAC is compared in constant time.
bool CheckSessionTicket(const std::string& worker_token, const std::string& presented, int64_t now_unix_s);

// The key the holder of ticket `id` ("tkt1.<expiry>.<nonce>", or tkt2's) proves it knows in the handshake:
// the ticket's mac as it is written (64 hex digits). "" when the id is malformed, has expired at
// now_unix_s, or worker_token is empty.
std::string SessionTicketKey(const std::string& worker_token, const std::string& id, int64_t now_unix_s);

}  // namespace tf::worker
