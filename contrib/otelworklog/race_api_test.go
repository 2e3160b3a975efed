//go:build race

package otelworklog

import "github.com/worklog/worklog/internal/apicheck/api"

func init() { api.BuildFlags = []string{"-race"} }
