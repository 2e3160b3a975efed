//go:build worklog_nowitness

package pebblelog

// witnessOff: this build has no sync witness (scripts/witness-ab.sh's B side). Its stores
// lose §7.2's protection of the newest WAL's tail: for measuring only.
const witnessOff = true
