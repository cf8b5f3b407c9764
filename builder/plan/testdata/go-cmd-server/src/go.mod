module "example.com/shop" // quoted, as go mod edit may write it

go 1.23.4

toolchain go1.24.1
