package projection

// VerifyOptions tune the check of a stored queue that rebuilds its projection from its log
// and compares (pebblelog.Store.Verify, postgres.Store.Verify: they share this type). The
// zero value is the default.
type VerifyOptions struct {
	// Progress, when set, is called now and then with the sequence reached and the last
	// one. Default: nil, no reports.
	Progress func(seq, last uint64)
}
