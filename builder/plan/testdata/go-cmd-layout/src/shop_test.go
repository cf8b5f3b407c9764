package shop_test

import (
	"testing"

	"example.com/shop"
)

// A test beside the library: the plan builds ./cmd/server all the same.
func TestGreeting(t *testing.T) {
	if shop.Greeting() == "" {
		t.Fatal("no greeting")
	}
}
