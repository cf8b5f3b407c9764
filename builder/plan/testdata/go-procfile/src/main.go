package main

import (
	"flag"
	"net/http"
)

func main() {
	addr := flag.String("addr", ":8080", "listen address")
	flag.Parse()
	http.ListenAndServe(*addr, nil)
}
