#pragma once
#include <cstddef>
#include <new>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

#include <strata/core/config.hpp>

namespace strata {

/// Out of memory: a std::bad_alloc whose message names the box, the request and the box's figures.
class out_of_memory : public std::bad_alloc {
public:
  out_of_memory(std::string_view box, std::size_t requested, std::string_view details)
      : message_(std::string(box) + ": out of memory allocating " + std::to_string(requested) + " bytes" +
                 (details.empty() ? std::string() : " (" + std::string(details) + ")")),
        requested_(requested)
  {}
  const char* what() const noexcept override { return message_.c_str(); }
  std::size_t requested() const noexcept { return requested_; }

private:
  std::string message_;
  std::size_t requested_;
};

/// A failed CUDA call other than out-of-memory: the code, the call and where it was made.
class cuda_error : public std::runtime_error {
public:
  cuda_error(cudaError_t code, std::string_view call, std::source_location where)
      : std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(code) + " (" +
                           cudaGetErrorString(code) + ") at " + where.file_name() + ":" +
                           std::to_string(where.line())),
        code_(code)
  {}
  cudaError_t code() const noexcept { return code_; }

private:
  cudaError_t code_;
};

/// Misuse caught by checked<R> (double free, foreign pointer, wrong size...).
class usage_error : public std::logic_error {
public:
  using std::logic_error::logic_error;
};

/// Figures for out_of_memory messages: "reserved X, in use Y".
inline std::string figures(std::size_t reserved, std::size_t in_use)
{
  return "reserved " + std::to_string(reserved) + " bytes, in use " + std::to_string(in_use) + " bytes";
}

} // namespace strata
