#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

/// One block inside a segment: where it starts (from the segment's base), how large, and whether free.
struct block_info {
  std::size_t offset = 0;
  std::size_t size = 0;
  bool free = false;
  long long stream = -1;  ///< the stream id that owns the block (stream_ordered), -1 where none
  bool operator==(const block_info&) const = default;
};

/// One physical allocation mapped into a reserved range (a page-mapped pool's segment): where, from the
/// segment's base, and how large; one entry per mapping made, so each unmap names a range a map named.
struct mapped_range {
  std::size_t offset = 0;
  std::size_t size = 0;
  bool operator==(const mapped_range&) const = default;
};

/// One chunk (segment, slab, region) held from the upstream, with its blocks in address order. A page-mapped
/// pool's segment is a reserved range that holds memory only where `mapped` lists it (address order); a
/// chunk's `mapped` is empty.
struct segment_info {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::vector<block_info> blocks;
  std::vector<mapped_range> mapped;
};

/// A pool's memory at one moment: what torch.cuda.memory_snapshot() shows, for any strata pool.
struct snapshot {
  std::string box;
  std::vector<segment_info> segments;

  std::size_t reserved() const noexcept
  {
    std::size_t total = 0;
    for (const auto& s : segments) total += s.size;
    return total;
  }
};

/// The snapshot as JSON: {"box": ..., "segments": [{"address", "size", "blocks": [...], "mapped": [...]}]},
/// "mapped" ({"offset", "size"} each) only where the segment lists mapped ranges.
inline std::string to_json(const snapshot& snap)
{
  std::string out = "{\"box\":\"";
  for (char c : snap.box) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += "\",\"segments\":[";
  bool first_segment = true;
  for (const auto& seg : snap.segments) {
    if (!first_segment) out += ',';
    first_segment = false;
    out += "{\"address\":" + std::to_string(seg.address) + ",\"size\":" + std::to_string(seg.size) + ",\"blocks\":[";
    bool first_block = true;
    for (const auto& b : seg.blocks) {
      if (!first_block) out += ',';
      first_block = false;
      out += "{\"offset\":" + std::to_string(b.offset) + ",\"size\":" + std::to_string(b.size) +
             ",\"free\":" + (b.free ? "true" : "false") + ",\"stream\":" + std::to_string(b.stream) + "}";
    }
    out += ']';
    if (!seg.mapped.empty()) {
      out += ",\"mapped\":[";
      for (std::size_t i = 0; i < seg.mapped.size(); ++i)
        out += (i == 0 ? "{\"offset\":" : ",{\"offset\":") + std::to_string(seg.mapped[i].offset) +
               ",\"size\":" + std::to_string(seg.mapped[i].size) + "}";
      out += ']';
    }
    out += '}';
  }
  out += "]}";
  return out;
}

} // namespace strata
