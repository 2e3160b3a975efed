package postgres

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// A commit's inserts take their rows as arrays, one per column ("INSERT ... SELECT * FROM
// unnest($1::bigint[], $2::bytea[], ...)"): one statement whatever the group's size. A group
// of one submit (W1 from one goroutine, the common case of a quiet queue) has one row in each,
// and there the arrays cost more than the row: the client encodes an array per column and the
// server sets up unnest's function scan. The same inserts as "VALUES ($1::bigint, ...)",
// measured on a copy of the tables with one submit's seven inserts a transaction (5,000 a
// shape, four interleaved rounds, fsync off, 2026-12-05): 279–298 µs a transaction with the
// arrays, 243–261 µs with the rows, about 40 µs less. So an insert of one row is sent in its
// single-row form (oneRowForms, queueRows); any other count, as arrays.

// oneRowOf is the single-row form of an insert whose rows come from unnest's arrays: the same
// statement with "SELECT * FROM unnest($1::t1[], ...)" replaced by "VALUES ($1::t1, ...)"
// (whatever follows, ON CONFLICT, is kept). It panics on a statement without that form: the
// statements are the package's own, and a test builds each.
func oneRowOf(sql string) string {
	const from = "SELECT * FROM unnest("
	i := strings.Index(sql, from)
	if i < 0 {
		panic(fmt.Sprintf("postgres: no unnest in %q", sql))
	}
	rest := sql[i+len(from):]
	j := strings.IndexByte(rest, ')')
	if j < 0 {
		panic(fmt.Sprintf("postgres: unnest not closed in %q", sql))
	}
	args := strings.Split(rest[:j], ",")
	for k, a := range args {
		a = strings.TrimSpace(a)
		t, ok := strings.CutSuffix(a, "[]")
		if !ok || !strings.HasPrefix(a, "$") {
			panic(fmt.Sprintf("postgres: unnest argument %q in %q is not an array parameter", a, sql))
		}
		args[k] = t
	}
	return sql[:i] + "VALUES (" + strings.Join(args, ", ") + ")" + rest[j+1:]
}

// oneRowForms maps each of the inserts to its single-row form.
func oneRowForms(inserts ...string) map[string]string {
	m := make(map[string]string, len(inserts))
	for _, s := range inserts {
		m[s] = oneRowOf(s)
	}
	return m
}

// queueRows queues the insert sql of the rows whose columns are cols (slices of one length):
// in its single-row form when there is one row and st has the form, else as arrays.
func queueRows(b *pgx.Batch, st *statements, sql string, cols ...any) {
	if one, ok := st.oneRow[sql]; ok {
		if row, ok := singleRow(cols); ok {
			b.Queue(one, row...)
			return
		}
	}
	b.Queue(sql, cols...)
}

// singleRow is the one row of cols, if each is a column of exactly one value.
func singleRow(cols []any) ([]any, bool) {
	row := make([]any, len(cols))
	for i, c := range cols {
		var ok bool
		switch c := c.(type) {
		case []int64:
			row[i], ok = only(c)
		case []int16:
			row[i], ok = only(c)
		case [][]byte:
			row[i], ok = only(c) // nil stays NULL, as in the array
		case []bool:
			row[i], ok = only(c)
		}
		if !ok {
			return nil, false
		}
	}
	return row, true
}

// only is c's one value, if it has exactly one.
func only[T any](c []T) (any, bool) {
	if len(c) != 1 {
		return nil, false
	}
	return c[0], true
}
