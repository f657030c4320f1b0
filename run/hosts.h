// Where the ranks of a `shoal run` job go: host lists, hostfiles, and the placement of ranks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shoal::run {

struct HostSlots {
  std::string host;
  int slots = 1;
};

// "host1:4,host2:4,host3" (no count: one slot). InvalidArgument on a malformed entry.
std::vector<HostSlots> parseHostList(std::string_view spec);

// One host per line: "host", "host:4" or "host slots=4" (OpenMPI's form); '#' starts a
// comment. InvalidArgument naming `source` and the line when malformed. May return no hosts.
std::vector<HostSlots> parseHostLines(std::string_view text, const std::string& source);

// parseHostLines() of a file. InvalidArgument naming the file when unreadable, malformed or
// empty.
std::vector<HostSlots> readHostfile(const std::string& path);

// localhost, a loopback address, or this machine's hostname: started without ssh.
bool isLocalHost(const std::string& host);

struct Placement {
  std::string host;
  bool local = true;
  int localRank = 0;
  int localSize = 1;
};

// Fills the hosts in order, each up to its slots. `ranks` 0 means every slot. No hosts: all
// ranks on this machine. InvalidArgument when the hosts offer fewer slots than ranks, or when a
// host does not resolve.
std::vector<Placement> placeRanks(int ranks, const std::vector<HostSlots>& hosts);

}  // namespace shoal::run
