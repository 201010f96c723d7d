#pragma once
#include <cstddef>
#include <memory>
#include <typeinfo>
#include <utility>

#include <strata/core/alignment.hpp>
#include <strata/core/cccl_names.hpp>
#include <strata/core/concepts.hpp>
#include <strata/core/errors.hpp>
#include <strata/core/properties.hpp>

namespace strata {

namespace detail {

template <class Derived, class Property>
struct declares_property {
  friend constexpr void get_property(const Derived&, Property) noexcept {}
};

template <bool Stream>
struct any_vtable {
  void* (*allocate)(void*, std::size_t, std::size_t);
  void (*deallocate)(void*, void*, std::size_t, std::size_t) noexcept;
  void* (*allocate_async)(void*, std::size_t, std::size_t, cuda::stream_ref);
  void (*deallocate_async)(void*, void*, std::size_t, std::size_t, cuda::stream_ref) noexcept;
  bool (*equal)(const void*, const void*) noexcept;
  void (*destroy)(void*) noexcept;
  const std::type_info& type;
};

template <bool Stream, class R>
inline constexpr any_vtable<Stream> vtable_for{
  [](void* r, std::size_t n, std::size_t a) { return static_cast<R*>(r)->allocate(n, a); },
  [](void* r, void* p, std::size_t n, std::size_t a) noexcept { static_cast<R*>(r)->deallocate(p, n, a); },
  [](void* r, std::size_t n, std::size_t a, cuda::stream_ref s) -> void* {
    if constexpr (Stream) return static_cast<R*>(r)->allocate_async(n, a, s);
    else return nullptr;  // never called: the synchronous any_resource has no stream-ordered methods
  },
  [](void* r, void* p, std::size_t n, std::size_t a, cuda::stream_ref s) noexcept {
    if constexpr (Stream) static_cast<R*>(r)->deallocate_async(p, n, a, s);
  },
  [](const void* a, const void* b) noexcept -> bool { return *static_cast<const R*>(a) == *static_cast<const R*>(b); },
  [](void* r) noexcept { delete static_cast<R*>(r); },
  typeid(R)};

/// The owning, type-erased box behind any_resource and any_stream_resource.
template <bool Stream, class... Properties>
class basic_any_resource : public declares_property<basic_any_resource<Stream, Properties...>, Properties>...,
                           public sync_names<basic_any_resource<Stream, Properties...>>,
                           public stream_first_names<basic_any_resource<Stream, Properties...>, Stream> {
public:
  using stream_first_names<basic_any_resource, Stream>::allocate;
  using stream_first_names<basic_any_resource, Stream>::deallocate;

  /// Takes any strata box with at least these properties (moved in; held on the heap).
  template <class R>
    requires(!std::same_as<std::remove_cvref_t<R>, basic_any_resource> && resource<std::remove_cvref_t<R>> &&
             (!Stream || stream_resource<std::remove_cvref_t<R>>) && (has_property<std::remove_cvref_t<R>, Properties> && ...))
  basic_any_resource(R&& r)
      : object_(new std::remove_cvref_t<R>(std::forward<R>(r))), vtable_(&vtable_for<Stream, std::remove_cvref_t<R>>)
  {}
  basic_any_resource(basic_any_resource&& other) noexcept
      : object_(std::exchange(other.object_, nullptr)), vtable_(other.vtable_)
  {}
  basic_any_resource& operator=(basic_any_resource&& other) noexcept
  {
    if (this != &other) {
      reset();
      object_ = std::exchange(other.object_, nullptr);
      vtable_ = other.vtable_;
    }
    return *this;
  }
  basic_any_resource(const basic_any_resource&) = delete;
  ~basic_any_resource() { reset(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment)
  {
    return vtable_->allocate(held(), bytes, alignment);
  }
  /// An empty any_resource handed nothing out: a free to it is ignored.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept
  {
    if (object_ != nullptr) vtable_->deallocate(object_, p, bytes, alignment);
  }
  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream)
    requires Stream
  {
    return vtable_->allocate_async(held(), bytes, alignment, stream);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) noexcept
    requires Stream
  {
    if (object_ != nullptr) vtable_->deallocate_async(object_, p, bytes, alignment, stream);
  }

  /// The held box, if it is an R (nullptr otherwise): to reach its own interface (usage(), release()...).
  template <class R>
  R* target() noexcept
  {
    return object_ != nullptr && vtable_->type == typeid(R) ? static_cast<R*>(object_) : nullptr;
  }
  /// The held box's type; typeid(void) when empty.
  const std::type_info& type() const noexcept { return object_ != nullptr ? vtable_->type : typeid(void); }
  explicit operator bool() const noexcept { return object_ != nullptr; }

  /// Equal when they hold boxes of one type that compare equal (memory from one may be freed by the other).
  friend bool operator==(const basic_any_resource& a, const basic_any_resource& b) noexcept
  {
    if (a.object_ == nullptr || b.object_ == nullptr) return a.object_ == b.object_;
    return a.vtable_->type == b.vtable_->type && a.vtable_->equal(a.object_, b.object_);
  }

private:
  void* held() const
  {
    if (object_ == nullptr) throw usage_error("any_resource: empty (moved from): it holds no box to allocate from");
    return object_;
  }

  void reset() noexcept
  {
    if (object_ != nullptr) vtable_->destroy(object_);
    object_ = nullptr;
  }

  void* object_;
  const any_vtable<Stream>* vtable_;
};

} // namespace detail

/// An owning, type-erased resource: a program picks a stack at run time and passes it across a
/// non-template boundary as any_resource<device_accessible>. It accepts any strata box with at least the
/// listed properties, and declares exactly those. Move-only and move-assignable; a moved-from any_resource is
/// empty: it converts to false, frees are ignored, allocate throws usage_error.
/// Models: resource (and cuda::mr::resource_with<Properties...>). Cost: one indirect call, then the box's.
template <class... Properties>
using any_resource = detail::basic_any_resource<false, Properties...>;

/// The same for stream-ordered boxes: also stream_resource and cuda::mr::async_resource_with<Properties...>.
template <class... Properties>
using any_stream_resource = detail::basic_any_resource<true, Properties...>;

static_assert(resource<any_resource<device_accessible>> && !stream_resource<any_resource<device_accessible>>);
static_assert(cuda::mr::resource_with<any_resource<device_accessible>, device_accessible>);
static_assert(!has_property<any_resource<device_accessible>, host_accessible>);
static_assert(stream_resource<any_stream_resource<device_accessible>>);
static_assert(cuda::mr::async_resource_with<any_stream_resource<device_accessible>, device_accessible>);

} // namespace strata
