-- One-time set-up of a PostgreSQL database for the streamberg catalog.
-- Run as a superuser:  psql -h HOST -U postgres -v pw='<password>' -f deploy/postgres/init.sql
--
-- The role owns the database, so it may create tables in its `public` schema: pyiceberg
-- creates iceberg_tables and iceberg_namespace_properties on first use, the compactor its
-- streamberg_compactor_leases table. (Since PostgreSQL 15, `public` is writable only by the
-- database owner; a role that merely has CONNECT cannot create them.)
CREATE ROLE streamberg LOGIN PASSWORD :'pw';
CREATE DATABASE streamberg OWNER streamberg ENCODING 'UTF8';
