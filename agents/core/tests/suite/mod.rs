mod approval;
mod chat;
mod harness;
mod plans;
mod second_brain;
mod store;
mod tickets;
mod time;
