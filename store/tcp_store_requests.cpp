// The TCP store's requests, served from bytes (store/tcp_store_requests.h).
#include "store/tcp_store_requests.h"

#include <algorithm>

#include "common/error.h"
#include "store/memory_store.h"

namespace shoal::store {

StoreRequests::StoreRequests(const TcpStoreServerOptions& o)
    : maxKeyBytes_(o.maxKeyBytes),
      maxValueBytes_(o.maxValueBytes),
      maxStoredBytes_(o.maxStoredBytes),
      maxParked_(o.maxParked),
      // A set or compare-set: three fields (their lengths) around a key and up to two values.
      maxFrame_(static_cast<uint32_t>(std::min<size_t>(
          wire::kMaxFrame, wire::kFrameHeader + 3 * 4 + o.maxKeyBytes + 2 * o.maxValueBytes))) {}

void StoreRequests::drain(RequestStream& s) {
  if (s.parked) {
    if (!handle(s, *s.parked)) return;
    s.parked.reset();
    --parked_;
  }
  while (s.out.size() < maxFrame_) {
    if (s.skip > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(s.skip, s.in.size()));
      s.in.erase(0, n);
      s.skip -= n;
      if (s.skip > 0) return;
    }
    auto len = wire::peekLength(s.in);
    if (len && *len > maxFrame_) {
      // Answer now, then discard the frame as it arrives: the client's write completes and it
      // reads this reply, instead of a reset connection it would retry.
      fail(s, fmt::format("request of {} bytes exceeds the store's limit of {} bytes (keys up to "
                          "{} bytes, values up to {} bytes)",
                          *len, maxFrame_, maxKeyBytes_, maxValueBytes_));
      s.in.erase(0, 4);
      s.skip = *len;
      continue;
    }
    auto m = wire::tryDecode(s.in, maxFrame_);
    if (!m) return;
    if (!handle(s, *m)) {
      if (parked_ >= maxParked_) {
        fail(s, fmt::format("too many waiting get/wait requests (limit {})", maxParked_));
        continue;
      }
      s.parked = std::move(m);
      ++parked_;
      return;
    }
  }
}

void StoreRequests::forget(RequestStream& s) {
  if (s.parked) --parked_;
  s.parked.reset();
}

void StoreRequests::fail(RequestStream& s, const std::string& why) {
  s.out += wire::encode(wire::kFailed, {why});
}

bool StoreRequests::keyOk(RequestStream& s, const std::string& key) {
  if (key.size() <= maxKeyBytes_) return true;
  fail(s, fmt::format("key of {} bytes exceeds the store's limit of {} bytes", key.size(),
                      maxKeyBytes_));
  return false;
}

bool StoreRequests::valueOk(RequestStream& s, const std::string& key, const std::string& value) {
  if (value.size() <= maxValueBytes_) return true;
  fail(s, fmt::format("value of {} bytes for key '{}' exceeds the store's limit of {} bytes",
                      value.size(), key.substr(0, 64), maxValueBytes_));
  return false;
}

bool StoreRequests::put(RequestStream& s, const std::string& key, const std::string& value) {
  auto it = data_.find(key);
  const size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
  const size_t now = stored_ - old + key.size() + value.size();
  // A write that shrinks what is held is always allowed, even over the limit.
  if (now > maxStoredBytes_ && now > stored_) {
    fail(s, fmt::format("the store is full ({} of {} bytes used)", stored_, maxStoredBytes_));
    return false;
  }
  data_[key] = value;
  stored_ = now;
  return true;
}

bool StoreRequests::handle(RequestStream& s, const wire::Message& m) {
  auto reply = [&](uint8_t status, std::vector<std::string> fields) {
    s.out += wire::encode(status, fields);
  };
  auto need = [&](size_t n) {
    if (m.fields.size() != n) {
      SHOAL_THROW(ProtocolError, "store command {} with {} fields, expected {}", m.code,
                  m.fields.size(), n);
    }
  };
  switch (m.code) {
    case wire::kSet:
      need(2);
      if (keyOk(s, m.fields[0]) && valueOk(s, m.fields[0], m.fields[1]) &&
          put(s, m.fields[0], m.fields[1])) {
        reply(wire::kOk, {});
      }
      return true;
    case wire::kGet: {
      need(1);
      if (!keyOk(s, m.fields[0])) return true;
      auto it = data_.find(m.fields[0]);
      if (it == data_.end()) return false;
      reply(wire::kOk, {it->second});
      return true;
    }
    case wire::kAdd: {
      need(2);
      if (!keyOk(s, m.fields[0])) return true;
      try {
        auto it = data_.find(m.fields[0]);
        int64_t v = (it == data_.end() ? 0 : parseCounter(m.fields[0], it->second)) +
                    parseCounter("delta", m.fields[1]);
        if (put(s, m.fields[0], std::to_string(v))) reply(wire::kOk, {std::to_string(v)});
      } catch (const StoreError& e) {
        reply(wire::kFailed, {e.what()});
      }
      return true;
    }
    case wire::kCompareSet: {
      need(3);
      if (!keyOk(s, m.fields[0]) || !valueOk(s, m.fields[0], m.fields[2])) return true;
      auto it = data_.find(m.fields[0]);
      std::string current = it == data_.end() ? std::string() : it->second;
      if (current == m.fields[1]) {
        if (!put(s, m.fields[0], m.fields[2])) return true;
        current = m.fields[2];
      }
      reply(wire::kOk, {current});
      return true;
    }
    case wire::kWait:
    case wire::kCheck: {
      for (const auto& k : m.fields) {
        if (!keyOk(s, k)) return true;
      }
      bool all = true;
      for (const auto& k : m.fields) all = all && data_.count(k) > 0;
      if (m.code == wire::kCheck) {
        reply(wire::kOk, {all ? "1" : "0"});
        return true;
      }
      if (!all) return false;
      reply(wire::kOk, {});
      return true;
    }
    case wire::kDelete: {
      need(1);
      auto it = data_.find(m.fields[0]);
      const bool found = it != data_.end();
      if (found) {
        stored_ -= it->first.size() + it->second.size();
        data_.erase(it);
      }
      reply(wire::kOk, {found ? "1" : "0"});
      return true;
    }
  }
  SHOAL_THROW(ProtocolError, "unknown store command {}", m.code);
}

}  // namespace shoal::store
