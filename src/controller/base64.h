// Standard base64 (RFC 4648, with padding): etcd's JSON gateway carries keys and values in it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tf::controller {

std::string Base64Encode(std::string_view in);
// nullopt when `in` is not valid padded base64.
std::optional<std::string> Base64Decode(std::string_view in);

}  // namespace tf::controller
