// Session tickets: what `tfusion run --remote` gives the tenant program instead of the worker's
// token. A ticket opens sessions on the worker until it expires, and nothing else: it cannot be
// turned back into the token or into a longer-lived ticket. Format:
//   tkt1.<expiry, Unix seconds>.<nonce, 32 hex>.<HMAC-SHA256(worker token, "tkt1.<expiry>.<nonce>"), 64 hex>
// Revoking every ticket at once: change the worker's token.
#pragma once

#include <cstdint>
#include <string>

namespace tf::worker {

// The handshake never sends a ticket whole: the client sends its id ("tkt1.<expiry>.<nonce>") and
// proves it knows the mac (transport/handshake.h, SplitCredential).
//
// A ticket valid until expires_unix_s, keyed with the worker's token. Empty when the token is
// empty (a worker without a token accepts anyone) or no randomness is available.
std::string MintSessionTicket(const std::string& worker_token, int64_t expires_unix_s);

// True when `presented` is a well-formed ticket made with worker_token that has not expired at
// now_unix_s. The MAC is compared in constant time.
bool CheckSessionTicket(const std::string& worker_token, const std::string& presented, int64_t now_unix_s);

// The key the holder of ticket `id` ("tkt1.<expiry>.<nonce>") proves it knows in the handshake:
// the ticket's mac as it is written (64 hex digits). "" when the id is malformed, has expired at
// now_unix_s, or worker_token is empty.
std::string SessionTicketKey(const std::string& worker_token, const std::string& id, int64_t now_unix_s);

}  // namespace tf::worker
