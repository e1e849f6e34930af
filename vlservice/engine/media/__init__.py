"""A request's images and clips: decoded within their limits and preprocessed (`images`, `video`,
`prepare`, in the caller's thread), and their features taken from the cache or the vision encoder
(`features`, on the scheduler's encoder thread)."""
