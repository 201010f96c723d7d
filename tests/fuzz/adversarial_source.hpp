#pragma once
// The upstream the differential fuzzer runs every stack on: the least a CUDA source promises and no more.
// It honours exactly 256-byte alignment (what device_source, async_source, pinned_source and managed_source
// declare), and every chunk starts at an odd multiple of 256, so no chunk is ever aligned better by luck. It
// refuses beyond a capacity, can be told to refuse the next call, and checks every free it receives against
// what it handed out: a policy that frees a chunk twice, with the wrong size, or never, is caught here.
// Its memory is address space that is never backed (simulated_source), so a policy that touches it faults.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include <strata/core/alignment.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>
#include <strata/source/simulated_source.hpp>

namespace strata::testing {

class adversarial_source {
public:
  static constexpr std::size_t max_alignment = default_alignment;

  explicit adversarial_source(std::size_t capacity) : capacity_(capacity) {}
  adversarial_source(const adversarial_source&) = delete;
  adversarial_source& operator=(const adversarial_source&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    ++calls_;
    check_alignment("adversarial_source", alignment, max_alignment);
    if (bytes == 0) return nullptr;
    if (refuse_next_ > 0) {
      --refuse_next_;
      throw out_of_memory("adversarial_source", bytes, "a refusal on purpose");
    }
    if (bytes > capacity_ - live_bytes_) throw out_of_memory("adversarial_source", bytes, figures(capacity_, live_bytes_));
    // simulated_source aligns its ranges to 512 here: one granule further on is an odd multiple of 256.
    auto* raw = static_cast<std::byte*>(space_.allocate(bytes + default_alignment, 2 * default_alignment));
    void* p = raw + default_alignment;
    chunks_.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
    live_bytes_ += bytes;
    return p;
  }

  void deallocate(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept
  {
    if (p == nullptr) return;
    const auto it = chunks_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == chunks_.end() || it->second != bytes) {
      ++bad_frees_;  // a foreign pointer, a double free or a wrong size: the fuzzer reports it
      return;
    }
    live_bytes_ -= bytes;
    chunks_.erase(it);
    if (on_return) on_return(reinterpret_cast<std::uintptr_t>(p), bytes);
    space_.deallocate(static_cast<std::byte*>(p) - default_alignment, bytes + default_alignment, 2 * default_alignment);
  }

  /// Told of every chunk taken back (the fuzzer's stream model forgets what was freed there).
  std::function<void(std::uintptr_t, std::size_t)> on_return;

  /// The next `calls` allocations are refused with out_of_memory, whatever room there is.
  void refuse_next(unsigned calls) noexcept { refuse_next_ = calls; }
  void refuse_nothing() noexcept { refuse_next_ = 0; }

  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t live_bytes() const noexcept { return live_bytes_; }
  std::size_t live_chunks() const noexcept { return chunks_.size(); }
  std::size_t bad_frees() const noexcept { return bad_frees_; }
  std::size_t calls() const noexcept { return calls_; }

  friend bool operator==(const adversarial_source& a, const adversarial_source& b) noexcept { return &a == &b; }
  friend constexpr void get_property(const adversarial_source&, device_accessible) noexcept {}

private:
  static std::string figures(std::size_t capacity, std::size_t live)
  {
    return "capacity " + std::to_string(capacity) + ", " + std::to_string(live) + " bytes live";
  }

  simulated_source space_{};
  std::size_t capacity_;
  std::size_t live_bytes_ = 0;
  std::size_t bad_frees_ = 0;
  std::size_t calls_ = 0;
  unsigned refuse_next_ = 0;
  std::map<std::uintptr_t, std::size_t> chunks_;
};

} // namespace strata::testing
