// expect: satisf(action of [^a-z_ ]+|y ')copying_page_backend[<']
// Must not compile: pause copies a tag's contents to pinned host memory, which a page backend without pin and
// copies cannot do; pause is not offered rather than offered and failing.
#include <strata/pages/simulated_pages.hpp>
#include <strata/policy/mapped_pool.hpp>

struct pages_that_cannot_copy : strata::simulated_pages {
  pages_that_cannot_copy() : strata::simulated_pages(std::size_t{2} << 20) {}
  void* pin(std::size_t) = delete;
};

int main()
{
  strata::mapped_pool<pages_that_cannot_copy> pool;
  pool.pause({1});
  return 0;
}
