#include "store/s3/credentials/aws_credentials.h"

#include <cctype>
#include <ctime>

namespace ddp::store_internal {
namespace {

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

}  // namespace

Result<WallClock::time_point> ParseIso8601(std::string_view t, std::string_view what) {
  auto bad = [&](std::string_view why) {
    // The text is a timestamp, safe to show; cap its length all the same.
    return DataLossError(std::string(what) + ": bad expiration time '" +
                         std::string(t.substr(0, 40)) + "': " + std::string(why));
  };
  size_t pos = 0;
  auto num = [&](size_t n, int* out) {
    if (t.size() - pos < n) return false;
    int v = 0;
    for (size_t i = 0; i < n; ++i) {
      char c = t[pos + i];
      if (!std::isdigit(static_cast<unsigned char>(c))) return false;
      v = v * 10 + (c - '0');
    }
    pos += n;
    *out = v;
    return true;
  };
  auto sep = [&](char c) {
    if (pos < t.size() && t[pos] == c) {
      ++pos;
      return true;
    }
    return false;
  };
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  if (!num(4, &y) || !sep('-') || !num(2, &mo) || !sep('-') || !num(2, &d) ||
      !(sep('T') || sep('t') || sep(' ')) || !num(2, &h) || !sep(':') || !num(2, &mi) ||
      !sep(':') || !num(2, &s)) {
    return bad("expected YYYY-MM-DDThh:mm:ssZ");
  }
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60) {
    return bad("field out of range");
  }
  int64_t frac_ns = 0;
  if (sep('.')) {
    size_t start = pos;
    int64_t scale = 100000000;
    while (pos < t.size() && std::isdigit(static_cast<unsigned char>(t[pos]))) {
      frac_ns += (t[pos] - '0') * scale;
      scale /= 10;
      ++pos;
    }
    if (pos == start) return bad("expected digits after '.'");
  }
  int64_t offset_s = 0;
  if (sep('Z') || sep('z')) {
  } else if (pos < t.size() && (t[pos] == '+' || t[pos] == '-')) {
    int sign = t[pos] == '+' ? 1 : -1;
    ++pos;
    int oh = 0, om = 0;
    bool colon = sep(':');
    static_cast<void>(colon);  // "+hh:mm" and "+hhmm" are both accepted
    if (!num(2, &oh) || oh > 23) return bad("bad UTC offset");
    colon = sep(':');
    if (!num(2, &om) || om > 59) {
      return bad("bad UTC offset");
    }
    offset_s = sign * (oh * 3600 + om * 60);
  } else {
    return bad("no time zone ('Z' or an offset)");
  }
  if (pos != t.size()) return bad("trailing characters");
  int64_t secs = DaysFromCivil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d)) * 86400 +
                 h * 3600 + mi * 60 + s - offset_s;
  return WallClock::time_point(std::chrono::duration_cast<WallClock::duration>(
      std::chrono::seconds(secs) + std::chrono::nanoseconds(frac_ns)));
}

RefreshingCredentials::RefreshingCredentials(Fetch fetch, Now now,
                                             std::chrono::seconds refresh_before,
                                             std::chrono::seconds retry_after)
    : fetch_(std::move(fetch)),
      now_(std::move(now)),
      refresh_before_(refresh_before),
      retry_after_(retry_after) {}

int RefreshingCredentials::fetches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fetches_;
}

void RefreshingCredentials::Invalidate() {
  std::lock_guard<std::mutex> lock(mu_);
  cached_.reset();
  next_try_ = {};
}

Result<AwsCredentials> RefreshingCredentials::FetchLocked() {
  Result<AwsCredentials> r = fetch_();
  WallClock::time_point now = now_();
  std::lock_guard<std::mutex> lock(mu_);
  ++fetches_;
  if (!r.ok()) {
    next_try_ = now + retry_after_;
    last_error_ = r.status();
    last_error_at_ = now;
    return r;
  }
  Cached c{*r, WallClock::time_point::max(), WallClock::time_point::max()};
  if (r->expiration) {
    auto lifetime = *r->expiration - now;
    if (lifetime > WallClock::duration::zero()) {
      c.expires_at = *r->expiration;
      c.refresh_at = *r->expiration - std::min<WallClock::duration>(refresh_before_, lifetime / 2);
    } else {
      c.expires_at = now + retry_after_;
      c.refresh_at = now + retry_after_ / 2;
    }
  }
  cached_ = std::move(c);
  next_try_ = {};
  last_error_ = Status::Ok();
  return r;
}

Result<AwsCredentials> RefreshingCredentials::Get() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_) {
      WallClock::time_point now = now_();
      if (!cached_->Expired(now) && (now < cached_->refresh_at || now < next_try_)) {
        return cached_->creds;
      }
    }
  }
  // A refresh is due. If the cached keys still work, one caller refreshes while the
  // others keep signing with them; otherwise everyone waits for the fetch.
  std::unique_lock<std::mutex> fetching(fetch_mu_, std::try_to_lock);
  if (!fetching.owns_lock()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ && !cached_->Expired(now_())) return cached_->creds;
    }
    fetching.lock();
  }
  // Another caller may have refreshed while this one waited.
  std::optional<AwsCredentials> still_valid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_) {
      WallClock::time_point now = now_();
      if (!cached_->Expired(now)) {
        if (now < cached_->refresh_at || now < next_try_) return cached_->creds;
        still_valid = cached_->creds;
      }
    }
  }
  if (!still_valid) {
    // Without usable keys every caller needs a fetch; after a failure moments ago,
    // fail fast instead of queueing a fetch per request of a large batch.
    std::lock_guard<std::mutex> lock(mu_);
    if (!last_error_.ok() && now_() < last_error_at_ + kFailFastWindow) return last_error_;
  }
  Result<AwsCredentials> r = FetchLocked();
  if (!r.ok() && still_valid) return *still_valid;  // early refresh failed: keep going
  return r;
}

}  // namespace ddp::store_internal
