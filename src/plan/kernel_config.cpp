// The kernel choice's spellings (kernel_config.h): its name, the transport's names and its ABI code.
#include "comfuse/kernel_config.h"

#include <cstdio>

#include "comfuse/abi.h"

namespace comfuse {

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::None: return "none";
    case Transport::L2: return "l2";
    case Transport::DsmemPeerToPeer: return "dsmem_p2p";
    case Transport::DsmemLeaderFollower: return "dsmem_leader";
  }
  return "?";
}

std::optional<Transport> parse_transport(std::string_view s) {
  for (Transport t : {Transport::None, Transport::L2, Transport::DsmemPeerToPeer, Transport::DsmemLeaderFollower})
    if (s == transport_name(t)) return t;
  return std::nullopt;
}

int transport_abi_code(Transport t) {
  switch (t) {
    case Transport::None:
    case Transport::L2: return COMFUSE_TRANSPORT_L2;
    case Transport::DsmemPeerToPeer: return COMFUSE_TRANSPORT_DSMEM_P2P;
    case Transport::DsmemLeaderFollower: return COMFUSE_TRANSPORT_DSMEM_LEADER;
  }
  return COMFUSE_TRANSPORT_L2;
}

namespace {
// A config name's transport suffixes (none for Transport::None).
const char* transport_suffix(Transport t) {
  switch (t) {
    case Transport::None: return "";
    case Transport::L2: return "_l2";
    case Transport::DsmemPeerToPeer: return "_p2p";
    case Transport::DsmemLeaderFollower: return "_leader";
  }
  return "";
}
}  // namespace

const char* tile_input_suffix(TileInputForm form) {
  return form == TileInputForm::Staged ? "_sr" : form == TileInputForm::Ring ? "_rr" : "";
}

KernelConfig library_config(int tile_n) {
  KernelConfig c;
  c.library = true;
  c.tile_m = 64;
  c.tile_n = tile_n;
  c.tile_k = 0;
  return c;
}

bool parse_config(const std::string& s, KernelConfig& c) {
  int used = 0;
  c = KernelConfig{};
  if (s.rfind("lib", 0) == 0) {   // the library form: "lib<tile_n>_c1x<cluster_n>..."
    c = library_config(0);
    if (std::sscanf(s.c_str(), "lib%d_c%dx%d%n", &c.tile_n, &c.cluster_m, &c.cluster_n, &used) != 3) return false;
  } else if (std::sscanf(s.c_str(), "%dx%dx%d_c%dx%d%n", &c.tile_m, &c.tile_n, &c.tile_k, &c.cluster_m, &c.cluster_n,
                         &used) != 5) {
    return false;
  }
  std::string rest = s.substr(static_cast<size_t>(used));
  auto take = [&](const std::string& suffix) {
    if (rest.compare(0, suffix.size(), suffix) != 0) return false;
    if (rest.size() > suffix.size() && rest[suffix.size()] != '_') return false;   // "_p2p" is not "_pt"...
    rest = rest.substr(suffix.size());
    return true;
  };
  c.cooperative = take("_coop");
  c.merged = take("_mg");
  if (take("_rg")) c.tile_input = TileInputForm::Registers;
  for (TileInputForm t : {TileInputForm::Staged, TileInputForm::Ring})
    if (take(tile_input_suffix(t))) c.tile_input = t;
  c.parts = take("_pt");
  c.async_stores = take("_as");
  c.store_in_ring = take("_ir");
  for (Transport t : {Transport::L2, Transport::DsmemPeerToPeer, Transport::DsmemLeaderFollower})
    if (take(transport_suffix(t))) c.transport = t;
  return rest.empty();
}

bool operator==(const KernelConfig& a, const KernelConfig& b) {
  return a.tile_m == b.tile_m && a.tile_n == b.tile_n && a.tile_k == b.tile_k && a.cluster_m == b.cluster_m &&
         a.cluster_n == b.cluster_n && a.cooperative == b.cooperative && a.merged == b.merged &&
         a.tile_input == b.tile_input && a.parts == b.parts && a.async_stores == b.async_stores &&
         a.store_in_ring == b.store_in_ring &&
         a.transport == b.transport && a.library == b.library;
}

std::string config_name(const KernelConfig& c) {
  std::string form;
  if (c.tile_input) form = *c.tile_input == TileInputForm::Registers ? "_rg" : tile_input_suffix(*c.tile_input);
  const std::string tile = c.library ? "lib" + std::to_string(c.tile_n)
                                     : std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n) + "x" + std::to_string(c.tile_k);
  return tile + "_c" + std::to_string(c.cluster_m) + "x" + std::to_string(c.cluster_n) + (c.cooperative ? "_coop" : "") +
         (c.merged ? "_mg" : "") + form + (c.parts ? "_pt" : "") + (c.async_stores ? "_as" : "") +
         (c.store_in_ring ? "_ir" : "") + transport_suffix(c.transport);
}

std::string b2b_config_name(const B2BKernelConfig& c) {
  std::string s = std::to_string(c.tile_m) + "x" + std::to_string(c.chunk) + "x" + std::to_string(c.tile_n2) + "x" +
                  std::to_string(c.tile_k);
  if (c.resident_k > 0) s += "_x" + std::to_string(c.resident_k);
  if (c.stagger) s += "_st";
  if (c.split_n1 > 1) s += "_c" + std::to_string(c.split_n1);
  return s;
}

}  // namespace comfuse
