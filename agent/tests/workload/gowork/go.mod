module gowork

go 1.19
