// Package shop is the library; the web server is in cmd/server.
package shop

func Greeting() string { return "welcome" }
