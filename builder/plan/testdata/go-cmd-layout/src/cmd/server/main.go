// The shop's web server, in the cmd/server layout: the module's root package is the
// library, the command is under cmd/. It answers with the library's greeting on $PORT,
// and says whether it could write a file into its working directory, which is its HOME.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"

	"example.com/shop"
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		wrote := "could not write"
		dir, _ := os.Getwd()
		if err := os.WriteFile("visits", []byte("1\n"), 0o644); err != nil {
			wrote += ": " + err.Error()
		} else if home, _ := os.UserHomeDir(); home == dir {
			wrote = "wrote visits in " + dir + ", its HOME"
		}
		fmt.Fprintf(w, "%s from cmd/server as uid %d, %s\n", shop.Greeting(), os.Getuid(), wrote)
	})
	log.Fatal(http.ListenAndServe(":"+port, nil))
}
