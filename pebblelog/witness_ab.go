//go:build !worklog_nowitness

package pebblelog

// witnessOff turns the sync witness off in a build with the tag worklog_nowitness, for the
// witness's A/B benchmark only (scripts/witness-ab.sh): never in a build that stores work.
const witnessOff = false
