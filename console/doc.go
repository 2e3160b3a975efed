// Package console is worklog's web console: an http.Handler over any *work.Queue that shows
// the queue live and as it was at any past sequence number, from the same fold as the store
// and the replay tool (docs/console.md). Mount it under a prefix with http.StripPrefix;
// `replay serve` serves it read-only over a store.
//
// It is secure by default (docs/console.md, "Security"):
//
//   - Read-only: every POST is refused with 403 and no action is offered, unless
//     Options.Actions is true, which requires Options.Authorize.
//   - Options.Authorize, when set, is asked about every request (pages, the API, the live
//     tail, the assets) before anything is read.
//   - It answers only to the Host names it is served at (a defence against DNS rebinding):
//     localhost and the loopback addresses unless Options.AllowedHosts lists others; any
//     other Host gets 421 Misdirected Request, with nothing read or changed.
//   - A POST whose Origin names another host, or that a browser marks cross-site, gets 403.
//
// # Where each part lives
//
//	console.go    New, Options, the request checks (Host, Authorize, Actions, origin), routing, the cut (at_seq)
//	pages.go      the HTML pages: overview, sessions, a session, a task, the log, stats
//	api.go        the JSON twins under /api/ and the actions (cancel, retry)
//	index.go      the console's own index of the log: sessions, kinds, counts over time
//	fold.go       a subject's history folded for its page, told by internal/narrate
//	timeline.go   a session's timeline
//	stream.go     the live tail (/log/stream, Server-Sent Events over Queue.Follow)
//	templates/    the pages' templates; assets/ their CSS and script
package console
