// AWS credentials as the s3:// back-end signs with them: fixed keys, or temporary keys
// with an expiry that a provider refreshes before they run out.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/status.h"

namespace ddp::store_internal {

using WallClock = std::chrono::system_clock;

struct AwsCredentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty unless temporary credentials
  std::string source;         // where they came from, for messages ("environment", ...)
  std::optional<WallClock::time_point> expiration;  // nullopt: never expire
};

// "2026-11-22T03:00:00Z", with optional fractional seconds and a "Z" or "+hh:mm" /
// "-hh:mm" offset, as AWS writes expiry times. kDataLoss naming `what` otherwise.
Result<WallClock::time_point> ParseIso8601(std::string_view text, std::string_view what);

// Where signing keys come from; thread-safe.
class CredentialsProvider {
 public:
  virtual ~CredentialsProvider() = default;
  // The keys to sign the next request with.
  virtual Result<AwsCredentials> Get() = 0;
  // Forgets cached temporary keys so the next Get() fetches new ones (after the server
  // said they expired). No-op for fixed keys.
  virtual void Invalidate() {}
};

class StaticCredentials final : public CredentialsProvider {
 public:
  explicit StaticCredentials(AwsCredentials c) : c_(std::move(c)) {}
  Result<AwsCredentials> Get() override { return c_; }

 private:
  const AwsCredentials c_;
};

// Caches what `fetch` returns and fetches again before it expires: once less than
// min(refresh_before, half the lifetime the keys had when fetched) is left, so keys of
// an hour are renewed 5 minutes before their end and short-lived test keys halfway.
//
// One fetch runs at a time. While the cached keys are still valid, a refresh that is due
// is done by one caller while the others go on with the cached keys; a failed early
// refresh keeps the cached keys and is tried again after `retry_after`. Once the keys
// have expired (or were invalidated), callers wait for the fetch and get its error;
// for a second after a failed fetch they get that error without fetching again.
class RefreshingCredentials final : public CredentialsProvider {
 public:
  using Fetch = std::function<Result<AwsCredentials>()>;
  using Now = std::function<WallClock::time_point()>;

  explicit RefreshingCredentials(Fetch fetch, Now now = &WallClock::now,
                                 std::chrono::seconds refresh_before = std::chrono::minutes(5),
                                 std::chrono::seconds retry_after = std::chrono::seconds(10));

  Result<AwsCredentials> Get() override;
  void Invalidate() override;

  // How many fetches ran (successful or not); for tests.
  int fetches() const;

 private:
  struct Cached {
    AwsCredentials creds;
    WallClock::time_point refresh_at;  // max() for keys that never expire
    // When callers must stop using them: their expiration; for keys that look expired
    // on arrival (our clock ahead of the agent's), `retry_after` after the fetch, so
    // they do not cause a fetch per request (the server has the last word).
    WallClock::time_point expires_at;
    bool Expired(WallClock::time_point now) const { return now >= expires_at; }
  };
  // Fetches and caches; called with fetch_mu_ held.
  Result<AwsCredentials> FetchLocked();

  const Fetch fetch_;
  const Now now_;
  const std::chrono::seconds refresh_before_;
  const std::chrono::seconds retry_after_;

  std::mutex fetch_mu_;         // one fetch at a time; taken before mu_
  mutable std::mutex mu_;       // guards the fields below
  std::optional<Cached> cached_;
  WallClock::time_point next_try_{};  // after a failed early refresh
  Status last_error_;                 // of the last fetch, if it failed ...
  WallClock::time_point last_error_at_{};  // ... at this time
  static constexpr std::chrono::seconds kFailFastWindow{1};
  int fetches_ = 0;
};

}  // namespace ddp::store_internal
