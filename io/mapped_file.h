// A read-only memory map of a whole file. Tensors read from a checkpoint are zero-copy views
// into it; a shared_ptr keeps the mapping alive as long as any view does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace strata {

class MappedFile {
 public:
  // Maps `path` read-only. Throws strata::Error naming the file when it cannot be opened or
  // mapped. An empty file maps to size() == 0 and data() == nullptr.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Hints the kernel that [offset, offset+length) will be read soon, sequentially.
  void will_need(size_t offset, size_t length) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace strata
