#include "tokenizer/normalize.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include "core/error.h"

namespace strata {

namespace {

// Lowest and highest valid second byte after a lead byte (Unicode Table 3-7).
bool second_byte_ok(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

int sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // 0x80..0xC1, 0xF5..0xFF never start a sequence
}

// Length of the well-formed sequence at text[i], or 0 with `bad` = bytes of the maximal
// ill-formed subpart to replace by one U+FFFD.
int well_formed(std::string_view text, size_t i, size_t& bad) {
  auto lead = static_cast<unsigned char>(text[i]);
  int n = sequence_length(lead);
  if (n == 1) return 1;
  if (n == 0) {
    bad = 1;
    return 0;
  }
  size_t k = 1;
  for (; k < static_cast<size_t>(n); ++k) {
    if (i + k >= text.size()) break;
    auto b = static_cast<unsigned char>(text[i + k]);
    bool ok = k == 1 ? second_byte_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
  }
  if (k == static_cast<size_t>(n)) return n;
  bad = k;
  return 0;
}

const icu::Normalizer2* icu_normalizer(NormalForm f) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (f) {
    case NormalForm::kNFC:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::kNFD:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::kNFKC:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::kNFKD:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  STRATA_ASSERT(U_SUCCESS(status) && n, "ICU normalizer unavailable: ", u_errorName(status));
  return n;
}

void add_forms(const Json& j, const std::string& what, std::vector<NormalForm>& forms) {
  if (j.is_null()) return;
  STRATA_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), what,
               ": \"normalizer\" must be null or an object with a \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    STRATA_CHECK(j.contains("normalizers") && j["normalizers"].is_array(), what,
                 ": normalizer Sequence needs a \"normalizers\" list");
    for (const Json& n : j["normalizers"])
      add_forms(n, what, forms);
  } else if (type == "NFC") {
    forms.push_back(NormalForm::kNFC);
  } else if (type == "NFD") {
    forms.push_back(NormalForm::kNFD);
  } else if (type == "NFKC") {
    forms.push_back(NormalForm::kNFKC);
  } else if (type == "NFKD") {
    forms.push_back(NormalForm::kNFKD);
  } else {
    fail(what, ": normalizer type '", type,
         "' is not supported (strata supports NFC, NFD, NFKC, NFKD and Sequence of them; see "
         "docs/TOKENIZER.md)");
  }
}

bool all_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

bool utf8_repair(std::string_view text, std::string& out) {
  size_t i = 0;
  // Fast scan: most text is valid.
  while (i < text.size()) {
    size_t bad = 0;
    int n = well_formed(text, i, bad);
    if (n == 0) break;
    i += n;
  }
  if (i == text.size()) return false;
  out.assign(text.data(), i);
  while (i < text.size()) {
    size_t bad = 0;
    int n = well_formed(text, i, bad);
    if (n > 0) {
      out.append(text.data() + i, n);
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return true;
}

char32_t utf8_next(std::string_view text, size_t& i) {
  auto c = static_cast<unsigned char>(text[i]);
  int n = sequence_length(c);
  STRATA_DEBUG_ASSERT(n > 0 && i + n <= text.size(), "utf8_next on invalid UTF-8");
  if (n <= 1) {
    ++i;
    return c;
  }
  char32_t cp = c & (0x7F >> n);
  for (int k = 1; k < n; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  i += n;
  return cp;
}

void utf8_append(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

Normalizer Normalizer::from_json(const Json& j, const std::string& what) {
  Normalizer n;
  add_forms(j, what, n.forms_);
  return n;
}

bool Normalizer::apply(std::string_view text, std::string& out) const {
  if (forms_.empty() || all_ascii(text)) return false;  // ASCII is invariant under every form
  std::string cur(text), next;
  bool changed = false;
  for (NormalForm f : forms_) {
    const icu::Normalizer2* n = icu_normalizer(f);
    UErrorCode status = U_ZERO_ERROR;
    icu::StringPiece piece(cur.data(), static_cast<int32_t>(cur.size()));
    if (n->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) continue;
    status = U_ZERO_ERROR;
    next.clear();
    icu::StringByteSink<std::string> sink(&next);
    n->normalizeUTF8(0, piece, sink, nullptr, status);
    STRATA_ASSERT(U_SUCCESS(status), "ICU normalizeUTF8 failed: ", u_errorName(status));
    cur.swap(next);
    changed = true;
  }
  if (changed) out = std::move(cur);
  return changed;
}

}  // namespace strata
