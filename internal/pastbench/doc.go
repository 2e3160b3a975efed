// Package pastbench holds the benchmarks of reading the past at scale (issue 49), each on a
// store built by internal/storegen: verify, the whole queue at a past seq, and Follow's
// catch-up. The store's size is $WORKLOG_BENCH_TASKS tasks (default 20,000, about 62k
// events); docs/performance.md's figures use 300,000 (930k events), kept between runs under
// $WORKLOG_STORE_CACHE:
//
//	WORKLOG_STORE_CACHE=/var/tmp/worklog-stores WORKLOG_BENCH_TASKS=300000 \
//	  go test ./internal/pastbench -run '^$' -bench . -benchtime 3x -cpu 1,2 -timeout 1h
package pastbench
