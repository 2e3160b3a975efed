package main

import (
	"net/url"
	"regexp"
	"strings"
)

// The secrets a PostgreSQL connection string can carry. Of libpq's connection parameters
// only these two hold a secret; the others that touch credentials (passfile, sslkey,
// sslcert, sslrootcert) name files, which are shown.
var secretParams = []string{"password", "sslpassword"}

const masked = "xxxxx"

// redactDSN returns s with every credential a PostgreSQL connection string can carry
// replaced by xxxxx: in a postgres:// URL the userinfo password and the password and
// sslpassword query parameters (however their keys are percent-encoded); in the key=value
// form (which a mistyped argument can be) the values of those keys. Anything else is
// returned as it is. Every place replay shows a store argument shows it through this
// function (displayName), and errors that might quote the URL are passed through it too.
func redactDSN(s string) string {
	if isPostgresURL(s) {
		return redactURL(s)
	}
	return kvSecret.ReplaceAllString(s, "${1}${2}="+masked)
}

// kvSecret matches a secret's keyword and value in a key=value connection string: a value
// in single quotes (with backslash escapes) or up to the next space.
var kvSecret = regexp.MustCompile(`(^|\s)(password|sslpassword)\s*=\s*(?:'(?:[^'\\]|\\.)*'?|\S*)`)

func redactURL(s string) string {
	scheme, rest, _ := strings.Cut(s, "://")
	// The query starts at the first '?'; the userinfo ends at the last '@' before it (an
	// unencoded '@' or '/' in a password must not leave part of it shown).
	head, query, hasQuery := strings.Cut(rest, "?")
	if at := strings.LastIndexByte(head, '@'); at >= 0 {
		if user, _, hasPW := strings.Cut(head[:at], ":"); hasPW {
			head = user + ":" + masked + head[at:]
		}
	} else if at := strings.LastIndexByte(query, '@'); hasQuery && at >= 0 {
		// A '?' inside the password: the userinfo runs into what looks like the query.
		// Mask everything from the password's start to the last '@', then go on with
		// the URL that follows it.
		// (Not when what follows the ':' is a port or a path: host:5432/db?x=a@b.)
		if user, pw, hasPW := strings.Cut(head, ":"); hasPW && !strings.Contains(pw, "/") && strings.Trim(pw, "0123456789") != "" {
			return redactURL(scheme + "://" + user + ":" + masked + query[at:])
		}
	}
	if !hasQuery {
		return scheme + "://" + head
	}
	pairs := strings.Split(query, "&")
	for i, p := range pairs {
		k, _, hasValue := strings.Cut(p, "=")
		if hasValue && isSecretKey(k) {
			pairs[i] = k + "=" + masked
		}
	}
	return scheme + "://" + head + "?" + strings.Join(pairs, "&")
}

// isSecretKey reports whether a URL query key, percent-decoded as libpq and pgx decode it,
// names a secret.
func isSecretKey(raw string) bool {
	k, err := url.PathUnescape(strings.TrimSpace(raw))
	if err != nil {
		k = raw
	}
	k = strings.TrimSpace(k)
	for _, s := range secretParams {
		if k == s {
			return true
		}
	}
	return false
}
