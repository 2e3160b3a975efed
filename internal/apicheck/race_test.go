//go:build race

package main

import "github.com/worklog/worklog/internal/apicheck/api"

func init() { api.BuildFlags = []string{"-race"} }
