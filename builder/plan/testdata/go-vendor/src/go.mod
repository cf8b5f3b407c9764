module example.com/vendored

go 1.22

require golang.org/x/text v0.14.0
