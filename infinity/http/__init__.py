"""The transport: the listening socket, HTTP/1.1 connections over httptools, the guards and the short lane."""
