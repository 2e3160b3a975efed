package postgres

import "context"

// DiskUsage is the size of the queue's tables on the server, their indexes and TOAST
// included (pg_total_relation_size), for replay stats: the format's tables and session_wakes.
func (s *Store) DiskUsage(ctx context.Context) (uint64, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	var n int64
	err := queryRow(ctx, s.e, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname = ANY($2)`,
		[]any{s.e.schema, append(tableNames[:len(tableNames):len(tableNames)], "session_wakes", "kind_policies", "kind_leases")}, &n)
	return uint64(n), backendError(err)
}
